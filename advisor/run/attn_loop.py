"""Close the loop for decode attention: the split-KV variant against torch SDPA's backends.

    from advisor.run.attn_loop import run_split_kv_loop
    result = run_split_kv_loop({"B": 1, "Hq": 32, "Hkv": 8, "D": 128, "S": 32768, "Lq": 1}, "bf16")
    result.verdict, result.winner, result.variant_path

A decode_attention_unsplit finding names the attention problem (from the aten operator's
shapes). This generates the split_kv variant for it and runs the file's own `--check --bench
--json` in a child process (a crash, a hang or a wrong result stays there): the variant is
checked against a float64 softmax, then it and torch SDPA's flash, cuDNN, efficient and math
backends are timed by CUDA-graph replays, beside the HBM floor. The variant is recommended
only when it beats every SDPA backend that ran and the observed kernel by more than the noise
margin; where an SDPA backend wins, the verdict says to switch to it. Without a GPU the file
is generated and the verdict says how to run it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import gpu as _gpu
from ..basics import NOISE_MARGIN, SPLIT_KV
from ..codegen.generate import check_attn, generate_split_kv
from ..codegen.schedule_model import Device

FLOOR = "hbm_floor"
_WHAT = {"sdpa_flash": "SDPA's flash backend", "sdpa_cudnn": "SDPA's cuDNN backend",
         "sdpa_efficient": "SDPA's memory-efficient backend", "sdpa_math": "SDPA's math backend",
         "variant": "the split-KV variant"}
_SWITCH = {"sdpa_flash": "torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)",
           "sdpa_cudnn": "torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)",
           "sdpa_efficient": "torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)",
           "sdpa_math": "torch.nn.attention.sdpa_kernel(SDPBackend.MATH)"}


@dataclass
class AttnResult:
    """One attention problem's measurements and verdict; the run report reads it as it reads
    advisor.run.loop.ShapeResult (`kind` tells them apart)."""

    attn: dict[str, int]
    dtype: str
    finding: dict | None = None
    observed_ns: int | None = None
    bench: dict = field(default_factory=dict)  # the variant's --bench JSON: provider -> {median_us | refused}
    check: dict | None = None
    error: str = ""
    winner: dict | None = None
    baseline: dict | None = None
    recommended: bool = False
    verdict: str = ""
    variant_path: Path | None = None
    variant_knobs: dict | None = None
    ran_on_gpu: bool = False
    model: dict = field(default_factory=dict)
    counters: dict | None = None
    kind: str = SPLIT_KV
    strategies: list[str] = field(default_factory=lambda: [SPLIT_KV])
    rows: list[dict] = field(default_factory=list)

    @property
    def shape(self) -> str:
        a = self.attn
        return f"B{a['B']} Hq{a['Hq']} Hkv{a['Hkv']} D{a['D']} S{a['S']}" + (f" Lq{a['Lq']}" if a["Lq"] != 1 else "")

    def table(self) -> list[dict]:
        """Observed kernel, then each provider: median, x the HBM floor, vs observed."""
        floor = (self.bench.get(FLOOR) or {}).get("median_us")
        out = []
        if self.observed_ns:
            out.append({"provider": "observed in trace", "median_us": self.observed_ns / 1e3, "status": "ok",
                        "rel_err": None})
        for p, r in self.bench.items():
            if p == FLOOR:
                continue
            ok = "median_us" in r
            out.append({"provider": p, "median_us": r.get("median_us"), "status": "ok" if ok else f"refused: {r.get('refused', '')}",
                        "rel_err": (self.check or {}).get("rel_err") if p == "variant" else None})
        ref = self.observed_ns / 1e3 if self.observed_ns else None
        for row in out:
            t = row["median_us"]
            row["x_floor"] = t / floor if t and floor else None
            row["vs_observed"] = ref / t if ref and t else None
            row.update(tflops=None, kernel_lines=None, knobs=None, config="", vs_torch_matmul=None)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape": dict(self.attn), "dtype": self.dtype, "strategies": self.strategies,
                "finding": self.finding, "observed_ns": self.observed_ns, "ran_on_gpu": self.ran_on_gpu,
                "hbm_floor_us": (self.bench.get(FLOOR) or {}).get("median_us"), "table": self.table(),
                "winner": self.winner, "baseline": self.baseline, "recommended": self.recommended,
                "verdict": self.verdict, "variant": self.variant_path.name if self.variant_path else None,
                "variant_knobs": self.variant_knobs, "check": self.check, "error": self.error or None,
                "model": self.model, "counters": self.counters}


def decide_attn(res: AttnResult) -> None:
    """The variant against the fastest SDPA backend (and the observed kernel): recommend it, or
    say which backend to switch to."""
    timed = {p: r for p, r in res.bench.items() if p != FLOOR and "median_us" in r}
    sdpa = {p: r for p, r in timed.items() if p.startswith("sdpa_")}
    if sdpa:
        best = min(sdpa, key=lambda p: sdpa[p]["median_us"])
        res.baseline = {"provider": best, "median_us": sdpa[best]["median_us"]}
    ours = timed.get("variant")
    if ours is None or not (res.check or {}).get("ok"):
        res.verdict = f"the split-KV variant did not pass its check or did not run: nothing to recommend ({res.error or 'no time'})"
        return
    res.winner = {"provider": "variant", "median_us": ours["median_us"], "rel_err": res.check.get("rel_err")}
    refs = [r["median_us"] for r in sdpa.values()] + ([res.observed_ns / 1e3] if res.observed_ns else [])
    vs = [f"{r['median_us'] / ours['median_us']:.2f}x {_WHAT[p]}" for p, r in sdpa.items()]
    if res.observed_ns:
        vs.insert(0, f"{res.observed_ns / 1e3 / ours['median_us']:.2f}x the observed kernel")
    floor = (res.bench.get(FLOOR) or {}).get("median_us")
    at = f", {ours['median_us'] / floor:.2f}x the HBM floor" if floor else ""
    res.recommended = bool(refs) and all(ours["median_us"] < (1 - NOISE_MARGIN) * r for r in refs)
    if res.recommended:
        res.verdict = f"split_kv wins: {', '.join(vs)}{at} (verified, rel. error {res.check['rel_err']:.1e})"
        return
    base = res.baseline
    observed_us = res.observed_ns / 1e3 if res.observed_ns else None
    if base and (observed_us is None or base["median_us"] < (1 - NOISE_MARGIN) * observed_us) \
            and base["median_us"] <= ours["median_us"]:
        res.verdict = (f"{_WHAT[base['provider']]} is the fastest here ({base['median_us']:.1f} us): switch to it with "
                       f"{_SWITCH[base['provider']]} rather than adopt a new kernel (split_kv: {', '.join(vs)}{at})")
    else:
        res.verdict = f"no variant beats the observed kernel by more than {NOISE_MARGIN:.0%}: keep it (split_kv: {', '.join(vs)}{at})"


def run_split_kv_loop(attn: dict[str, int], dtype: str, *, budget_s: float = 300.0, observed_ns: int | None = None,
                      finding: dict | None = None, out_dir: Path | None = None, sm_count: int | None = None) -> AttnResult:
    """Generate the split-KV variant for `attn` and, on a GPU, check and time it against torch
    SDPA's backends in a child process (at most `budget_s` seconds)."""
    attn = check_attn(dict(attn))
    res = AttnResult(attn, dtype, finding=finding, observed_ns=observed_ns)
    name = f"variant_{finding['symptom'] if finding else SPLIT_KV}_{res.shape.replace(' ', '_')}.py"
    path = (out_dir or Path("advisor-run")) / name
    if not _gpu.gpu_present():
        if out_dir is not None:
            v = generate_split_kv(attn, dtype=dtype, finding=finding, device=Device(sm_count=sm_count) if sm_count else None,
                                  path=path)
            res.variant_path, res.variant_knobs = path, v.knobs
        res.verdict = ("not run: no CUDA GPU here; on one, run the generated file with --check --bench "
                       "(it times torch SDPA's flash, cuDNN, efficient and math backends beside it)")
        return res
    dev, tuned = _gpu.device_spec()
    v = generate_split_kv(attn, dtype=dtype, finding=finding, device=dev, tuned_for=tuned, path=path)
    res.variant_path, res.variant_knobs = path, v.knobs
    try:
        proc = subprocess.run([sys.executable, str(path), "--check", "--bench", "--json"], capture_output=True, text=True,
                              timeout=budget_s, cwd=path.parent)
    except subprocess.TimeoutExpired:
        res.error = f"timeout after {budget_s:.0f} s"
    else:
        if proc.returncode == 0:
            try:
                out = json.loads(proc.stdout)
                res.check, res.bench = out.get("check"), out.get("bench") or {}
            except ValueError:
                res.error = "unreadable output"
        else:
            res.error = (proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[-1][:300]
    res.ran_on_gpu = True
    decide_attn(res)
    return res
