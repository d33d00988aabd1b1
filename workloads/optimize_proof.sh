#!/usr/bin/env bash
# The end-to-end proof of issue 35 on one GPU (H200, under 6 minutes): `advisor optimize` on the
# planted mixed workload and on a GPT-2-shaped training step (vocab 50257), then the one-line
# fix (vocab padded to 50304) profiled and compared against the unpadded step.
#   bash workloads/optimize_proof.sh [OUT]          (default out/optimize_proof)
#   tar czf optimize_proof.tgz -C out optimize_proof
# Writes, under OUT:
#   planted_mixed/    advisor optimize of `planted.py mixed --steps 3 --gemm torch`: report.md/json, compare.md/json,
#                     before/ after/ (traces + diagnosis), run/ (variants, run_report)
#   gpt2/             the same for `gpt2_step.py --steps 5` (vocab 50257): three misaligned_gemm findings (the LM
#                     head and its two backward GEMMs), the padding as the code change, and their staged
#                     fallback variants verified, timed and routed with advisor.use (forward and backward)
#   gpt2_padded/      advisor profile of `gpt2_step.py --steps 5 --pad`
#   gpt2_pad_compare/ advisor compare gpt2/before vs gpt2_padded: compare.md/json
#   SUMMARY.md        verdicts and speedups in one table ("nothing applied (why)" where nothing was);
#                     *.log the commands' output
# Every run uses the PyTorch profiler (--kineto): it records the GEMM shapes that variants are
# run for. Needs torch, triton and transformers on the GPU machine.
# Smoke run without a GPU (the wiring up to the first trace, which records no GPU kernels there, so
# each step stops with "no GPU kernel activity"):
#   ADVISOR_PROOF_SMOKE=1 bash workloads/optimize_proof.sh /tmp/proof
set -u
out=${1:-out/optimize_proof}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
PY=${PYTHON:-python3}
smoke=${ADVISOR_PROOF_SMOKE:-0}
if [ "$smoke" = 1 ]; then
  planted=("$PY" "$here/gpt2_step.py" --device cpu --tiny --steps 2)   # planted.py needs a GPU
  gpt2=("$PY" "$here/gpt2_step.py" --device cpu --tiny --steps 2)
  gpt2_pad=("$PY" "$here/gpt2_step.py" --device cpu --tiny --steps 2 --pad)
  kineto=(--kineto)
else
  planted=("$PY" "$here/planted.py" mixed --steps 3 --gemm torch)
  gpt2=("$PY" "$here/gpt2_step.py" --steps 5)
  gpt2_pad=("$PY" "$here/gpt2_step.py" --steps 5 --pad)
  # the PyTorch profiler records every GEMM's shape (Input Dims, backward included); a whole-
  # process nsys capture without emit_nvtx names none, and optimize runs variants per shape
  kineto=(--kineto)
fi
adv=("$PY" -m advisor.cli)
trace_of() {  # the trace `advisor profile`/`optimize` wrote in DIR under NAME: nsys report or Kineto
  for f in "$1/$2.nsys-rep" "$1/$2.json.gz"; do [ -f "$f" ] && { echo "$f"; return; }; done
}
start=$(date +%s)

# GPT-2 first (the proof of the misaligned-GEMM fallback and the one-line fix), then the planted
# workload with what is left of 6 minutes: each step is cut off by `timeout` so the whole stays under it
left() { echo $(( 350 - ($(date +%s) - start) )); }

echo "== 1/4 optimize: GPT-2-shaped training step, vocab 50257 (misaligned LM head: staged fallback routed)"
timeout 220 "${adv[@]}" optimize "${kineto[@]}" --budget-s 12 --out "$out/gpt2" -- "${gpt2[@]}" \
  >"$out/gpt2.log" 2>&1 || echo "   exit $? (see gpt2.log)"

echo "== 2/4 profile: the one-line fix (vocab padded to 50304)"
timeout 60 "${adv[@]}" profile "${kineto[@]}" --out "$out/gpt2_padded" -- "${gpt2_pad[@]}" \
  >"$out/gpt2_padded.log" 2>&1 || echo "   exit $? (see gpt2_padded.log)"

echo "== 3/4 compare: unpadded vs padded"
b=$(trace_of "$out/gpt2/before" before); a=$(trace_of "$out/gpt2_padded" profile)
if [ -n "$b" ] && [ -n "$a" ]; then
  timeout 30 "${adv[@]}" compare "$b" "$a" --out "$out/gpt2_pad_compare" >"$out/gpt2_pad_compare.log" 2>&1 || echo "   exit $?"
else
  echo "   missing trace (before: '$b', padded: '$a')"
fi

echo "== 4/4 optimize: planted mixed workload ($(left) s left)"
if [ "$(left)" -gt 60 ]; then
  timeout "$(left)" "${adv[@]}" optimize "${kineto[@]}" --budget-s 8 --out "$out/planted_mixed" -- "${planted[@]}" \
    >"$out/planted_mixed.log" 2>&1 || echo "   exit $? (see planted_mixed.log)"
else
  echo "   skipped: under 60 s left of the 6 minutes" | tee "$out/planted_mixed.log"
fi

"$PY" - "$out" <<'EOF' >"$out/SUMMARY.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])


def ms(ns):
    return f"{ns / 1e6:.2f} ms"


def nothing(d):  # why optimize applied nothing: its note, which names the reason
    why = next((n for n in d.get("notes", []) if n.startswith("nothing applied")), "nothing applied")
    return why.replace("|", "/")


print("# advisor optimize proof\n")
print("| run | verdict | speedup | GPU busy | applied (calls) | estimate vs measured, per step |")
print("|---|---|---|---|---|---|")
gpt2 = None
for name, f in [("gpt2, staged fallback routed (advisor.use)", "gpt2/report.json"),
                ("gpt2, the one-line fix: vocab padded to 50304", "gpt2_pad_compare/compare.json"),
                ("planted mixed", "planted_mixed/report.json")]:
    p = out / f
    if not p.is_file():
        print(f"| {name} | (no report: see the log) | | | | |"); continue
    d = json.loads(p.read_text())
    if f == "gpt2/report.json":
        gpt2 = d
    if "command" in d and not d.get("compare"):  # an optimize report that applied nothing
        print(f"| {name} | {nothing(d)} | - | - | - | - |"); continue
    c = d.get("compare", d) or {}
    applied = ", ".join(f"{a['variant']}{' (staged)' if a.get('staged') else ''}: {a['calls']}"
                        for a in d.get("applied", [])) or "-"
    est = d.get("estimate") or {}
    em = (f"{ms(est.get('estimated_ns_per_step', 0))} est. (isolated timing), {ms(est.get('measured_ns_per_step', 0))} "
          "measured" if est else "-")
    if f.startswith("gpt2_pad") and gpt2:
        # the padding's estimate: each misaligned GEMM's saving per launch (each runs once a step here)
        pads = [x for x in gpt2["before"]["findings"] if x["strategy"] == "pad_dimension"]
        e = sum(x["est_savings_ns"] / max(1, x["launches"]) for x in pads)
        g = next((k["delta_ns"] for k in c.get("classes") or [] if k.get("class") == "gemm"), None)
        em = f"{ms(e)} est. (padded GEMMs' roofline)" + (f", GEMM time {ms(-g)} less measured" if g is not None else "")
    print(f"| {name} | {c.get('verdict')} | {c.get('speedup')} | {c.get('gpu_speedup')} | {applied} | {em} |")
EOF
echo "== done in $(( $(date +%s) - start )) s: $out/SUMMARY.md"
cat "$out/SUMMARY.md"
