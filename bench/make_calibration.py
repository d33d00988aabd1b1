"""Derive rules/measured/<device>.toml from the committed long-format bench rows.

advisor bounds every estimate by what we measured: the device's ceilings (the fastest dense
GEMM rate per dtype and the device-to-device copy bandwidth) and, per schedule, the speed it
reached over cuBLAS (`torch.matmul`) and over our data-parallel Triton baseline (`dp`) on each
shape of the suites. Per (run, shape, dtype) the best final-phase time of each provider is
compared with the same run's baselines (interleaved rounds, so one clock state); the TOML keeps
the median of those per-run ratios (what a schedule typically reached) and their count.

    python bench/make_calibration.py bench/results/h200.csv rules/measured/h200.toml
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path


def _ceilings(rows: list[dict]) -> dict:
    rates: dict[str, list[float]] = defaultdict(list)
    copy: list[float] = []
    for r in rows:
        if r["suite"] != "ceiling" or r["status"] != "ok":
            continue
        if r["provider"] == "copy" and r["gbps"] and r["timer"] == "do_bench":
            copy.append(float(r["gbps"]) * 1e9)
        elif r["provider"] == "torch.matmul" and r["tflops"]:
            # an fp32 product with allow_tf32 runs on the tensor cores: a dtype of its own
            dtype = "tf32" if r["dtype"] == "fp32" and '"allow_tf32": true' in (r["config"] or "") else r["dtype"]
            rates[dtype].append(float(r["tflops"]))
    out = {"copy_bytes_per_s": max(copy), "copy_runs": len(copy)}
    # the fastest rate seen is the ceiling a floor divides by (a floor must not be too high)
    out["dense_tflops"] = {dt: round(max(v), 1) for dt, v in sorted(rates.items())}
    out["dense_tflops_median"] = {dt: round(statistics.median(v), 1) for dt, v in sorted(rates.items())}
    return out


def _ratios(rows: list[dict]) -> list[dict]:
    best: dict[tuple, float] = {}
    for r in rows:
        if r["phase"] != "final" or r["status"] != "ok" or r["suite"] in ("ceiling", "timer_check"):
            continue
        key = (r["suite"], r["run_id"], r["shape"], r["dtype"], r["provider"])
        best[key] = min(best.get(key, float("inf")), float(r["median_us"]))
    runs: dict[tuple, dict] = defaultdict(dict)
    for (suite, run, shape, dtype, provider), us in best.items():
        runs[(suite, run, shape, dtype)][provider] = us
    per: dict[tuple, list[float]] = defaultdict(list)
    for (suite, _run, shape, dtype), d in runs.items():
        for ref, ref_name in (("torch.matmul", "cublas"), ("dp", "dp")):
            if ref not in d:
                continue
            for provider, us in d.items():
                if provider not in (ref, "torch.matmul"):
                    per[(suite, shape, dtype, provider, ref_name)].append(d[ref] / us)
    out = []
    for (suite, shape, dtype, provider, ref), v in sorted(per.items()):
        out.append({"suite": suite, "shape": shape, "dtype": dtype, "strategy": provider, "versus": ref,
                    "ratio": round(statistics.median(v), 3), "best": round(max(v), 3), "runs": len(v)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rows", type=Path)
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    rows = list(csv.DictReader(a.rows.open(encoding="utf-8")))
    device = rows[0]["device"]
    dates = sorted(r["date"][:10] for r in rows if r["date"])
    c = _ceilings(rows)
    lines = [
        f"# Derived by bench/make_calibration.py from {a.rows.as_posix()}: regenerate, do not edit.",
        f"# {len(rows)} rows measured {dates[0]}..{dates[-1]}.",
        f'device = "{device}"',
        f"sm_count = {int(rows[0]['sm_count'])}",
        "",
        "[ceilings]",
        "# device-to-device copy, bytes read + written per second (fastest of the runs)",
        f"copy_bytes_per_s = {c['copy_bytes_per_s']:.4g}",
        f"copy_runs = {c['copy_runs']}",
        "",
        "[ceilings.dense_tflops]",
        "# torch.matmul 8192^3, fastest run per dtype (fp32: SIMT cores, TF32 off; tf32: fp32 with allow_tf32)",
        *[f"{dt} = {v}" for dt, v in c["dense_tflops"].items()],
        "",
        "[ceilings.dense_tflops_median]",
        *[f"{dt} = {v}" for dt, v in c["dense_tflops_median"].items()],
        "",
    ]
    for r in _ratios(rows):
        lines += ["[[schedule]]", *[f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in r.items()], ""]
    a.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
