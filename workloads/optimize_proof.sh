#!/usr/bin/env bash
# The end-to-end proof of issue 35 on one GPU (H200, under 8 minutes): `advisor optimize` on the
# planted mixed workload and on a GPT-2-shaped training step (vocab 50257), then the one-line
# fix (vocab padded to 50304) profiled and compared against the unpadded step.
#   bash workloads/optimize_proof.sh [OUT]          (default out/optimize_proof)
#   tar czf optimize_proof.tgz -C out optimize_proof
# Writes, under OUT:
#   planted_mixed/    advisor optimize of `planted.py mixed --steps 3 --gemm torch`: report.md/json, compare.md/json,
#                     before/ after/ (traces + diagnosis), run/ (variants, run_report)
#   gpt2/             the same for `gpt2_step.py --steps 5` (vocab 50257)
#   gpt2_padded/      advisor profile of `gpt2_step.py --steps 5 --pad`
#   gpt2_pad_compare/ advisor compare gpt2/before vs gpt2_padded: compare.md/json
#   SUMMARY.md        verdicts and speedups in one table; *.log the commands' output
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

echo "== 1/4 optimize: planted mixed workload"
timeout 200 "${adv[@]}" optimize "${kineto[@]}" --budget-s 15 --out "$out/planted_mixed" -- "${planted[@]}" \
  >"$out/planted_mixed.log" 2>&1 || echo "   exit $? (see planted_mixed.log)"

echo "== 2/4 optimize: GPT-2-shaped training step, vocab 50257"
timeout 300 "${adv[@]}" optimize "${kineto[@]}" --budget-s 20 --out "$out/gpt2" -- "${gpt2[@]}" \
  >"$out/gpt2.log" 2>&1 || echo "   exit $? (see gpt2.log)"

echo "== 3/4 profile: the one-line fix (vocab padded to 50304)"
timeout 120 "${adv[@]}" profile "${kineto[@]}" --out "$out/gpt2_padded" -- "${gpt2_pad[@]}" \
  >"$out/gpt2_padded.log" 2>&1 || echo "   exit $? (see gpt2_padded.log)"

echo "== 4/4 compare: unpadded vs padded"
b=$(trace_of "$out/gpt2/before" before); a=$(trace_of "$out/gpt2_padded" profile)
if [ -n "$b" ] && [ -n "$a" ]; then
  "${adv[@]}" compare "$b" "$a" --out "$out/gpt2_pad_compare" >"$out/gpt2_pad_compare.log" 2>&1 || echo "   exit $?"
else
  echo "   missing trace (before: '$b', padded: '$a')"
fi

"$PY" - "$out" <<'EOF' >"$out/SUMMARY.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("# advisor optimize proof\n")
print("| run | verdict | speedup | GPU busy | applied (calls) | estimate vs measured |")
print("|---|---|---|---|---|---|")
for name, f in [("planted mixed", "planted_mixed/report.json"), ("gpt2 (advisor.use)", "gpt2/report.json"),
                ("gpt2 padded 50304", "gpt2_pad_compare/compare.json")]:
    p = out / f
    if not p.is_file():
        print(f"| {name} | (no report) | | | | |"); continue
    d = json.loads(p.read_text())
    c = d.get("compare", d) or {}
    applied = ", ".join(f"{a['variant']} ({a['calls']})" for a in d.get("applied", [])) or "-"
    est = d.get("estimate") or {}
    em = (f"{est.get('estimated_ns_per_step', 0) / 1e3:.0f} us est, {est.get('measured_ns_per_step', 0) / 1e3:.0f} us "
          f"measured per step" if est else "-")
    print(f"| {name} | {c.get('verdict')} | {c.get('speedup')} | {c.get('gpu_speedup')} | {applied} | {em} |")
EOF
echo "== done in $(( $(date +%s) - start )) s: $out/SUMMARY.md"
cat "$out/SUMMARY.md"
