"""Derive rules/measured/<device>.toml from the committed long-format bench rows.

advisor bounds every estimate by what we measured: the device's ceilings (the fastest dense
GEMM rate per dtype and the device-to-device copy bandwidth) and, per schedule, the speed it
reached over cuBLAS (`torch.matmul`) and over our data-parallel Triton baseline (`dp`) on each
shape of the suites. Per (run, shape, dtype) the best final-phase time of each provider is
compared with the same run's baselines (interleaved rounds, so one clock state); the TOML keeps
the median of those per-run ratios (what a schedule typically reached) and their count.

The Gluon cluster GEMM (strategy `cluster_gemm`, Triton >= 3.9) has its own bench and rows
(`--cluster-rows`, one file a run): per run and shape its best config that passed verification
and is still in the schedule's search space, against torch.matmul in the same run; the TOML
keeps the median over runs, the best run, the run count and the Triton version.

Op-by-op attention against SDPA (`--attention-rows`, bench/bench_attention_fusion.py) becomes
one `[[attention_fusion]]` entry per shape: eager and SDPA median us and their ratio, which
bounds what the `unfused_attention` rule may claim.

A materialised attention bias and its remedies (`--attention-bias-rows`,
bench/bench_attention_bias.py) become one `[[attention_bias]]` entry per shape: the bias's bytes,
each provider's median us, and the rate Inductor's compiled build wrote it at, as bytes a second
and as a fraction of the copy bandwidth above (what a GPU we have not measured is credited with),
which bounds what the `materialised_attention_bias` rule may claim.

A convolution in 16-bit and in fp32 (`--conv-rows`, bench/probe_grouped_conv.py) becomes one
`[[conv]]` entry per shape and 16-bit dtype: cuDNN's forward + backward time each way and their
ratio, which bounds what the `slow_convolution` rule may claim.

    python bench/make_calibration.py bench/results/h200.csv.gz rules/measured/h200.toml \
        --cluster-rows bench/results/cluster_gemm/cluster_gemm.csv bench/results/cluster_gemm/round2/cluster_gemm.csv \
            bench/results/cluster_gemm/round3/skinny/cluster_gemm.csv bench/results/cluster_gemm/round3/tail_balanced/cluster_gemm.csv \
        --attention-rows bench/results/attention_fusion/attention_fusion.csv \
        --attention-bias-rows bench/results/attention_bias/attention_bias.csv \
        --conv-rows bench/results/grouped_conv/grouped_conv.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import open_text  # noqa: E402  (.csv or .csv.gz)


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


def _in_search_space(r: dict) -> bool:
    """Whether the row's config is one the schedule would still try on its shape: a step that
    was dropped (round 1's non-WS `pipe`) no longer speaks for the schedule."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.gluon_gemm_configs import Config, search_space

    cfg = Config(**json.loads(r["config"]))
    return cfg in search_space(int(r["M"]), int(r["N"]), int(r["K"]))


def _verified(path: Path) -> set[str] | None:
    """Configs (canonical JSON) the run's verification passed, or None without the file."""
    v = path.with_name("cluster_gemm_verify.json")
    if not v.is_file():
        return None
    data = json.loads(v.read_text(encoding="utf-8"))
    return {json.dumps(json.loads(k), sort_keys=True) for k, d in data.items() if d.get("status") == "ok"}


def _cluster_ratios(paths: list[Path]) -> list[dict]:
    """cluster_gemm over cuBLAS per (suite, shape, dtype): per run the best verified config
    against torch.matmul in that run, then the median over runs."""
    per: dict[tuple, list[float]] = defaultdict(list)
    triton: dict[tuple, set[str]] = defaultdict(set)
    for path in paths:
        ok = _verified(path)
        best: dict[tuple, float] = {}
        ref: dict[tuple, float] = {}
        for r in csv.DictReader(open_text(path)):
            if r["status"] != "ok" or not r["median_us"]:
                continue
            key = (r["suite"], r["run_id"], r["shape"], r["dtype"])
            if r["provider"] == "torch.matmul":
                ref[key] = min(ref.get(key, float("inf")), float(r["median_us"]))
            elif r["provider"] == "cluster_gemm" and _in_search_space(r) and (
                    ok is None or json.dumps(json.loads(r["config"]), sort_keys=True) in ok):
                best[key] = min(best.get(key, float("inf")), float(r["median_us"]))
                triton[(r["suite"], r["shape"], r["dtype"])].add(r["triton"])
        for (suite, _run, shape, dtype), us in best.items():
            if (suite, _run, shape, dtype) in ref:
                per[(suite, shape, dtype)].append(ref[(suite, _run, shape, dtype)] / us)
    out = []
    for (suite, shape, dtype), v in sorted(per.items()):
        out.append({"suite": suite, "shape": shape, "dtype": dtype, "strategy": "cluster_gemm", "versus": "cublas",
                    "ratio": round(statistics.median(v), 3), "best": round(max(v), 3), "runs": len(v),
                    "triton": ",".join(sorted(triton[(suite, shape, dtype)]))})
    return out


def _attention_fusion(paths: list[Path]) -> list[dict]:
    """Per shape: op-by-op attention over SDPA in the same run (median us), the SDPA backend."""
    out = []
    for path in paths:
        rows = list(csv.DictReader(open_text(path)))
        by = defaultdict(dict)
        for r in rows:
            by[r["shape"]][r["provider"]] = r
        for shape, pr in by.items():
            if "eager" not in pr or "sdpa" not in pr:
                continue
            e, s = pr["eager"], pr["sdpa"]
            row = {"shape": shape, "BH": int(e["BH"]), "L": int(e["L"]), "S": int(e["S"]), "D": int(e["D"]),
                   "dtype": {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(e["dtype"], e["dtype"]),
                   "bias": e["bias"] == "True", "causal": e["causal"] == "True", "backend": s["backend"],
                   "eager_us": float(e["p50"]), "sdpa_us": float(s["p50"]),
                   "ratio": round(float(e["p50"]) / float(s["p50"]), 3)}
            if "eager_train" in pr and "sdpa_train" in pr:  # the backward alone: (forward + backward) - forward
                eb = float(pr["eager_train"]["p50"]) - float(e["p50"])
                sb = float(pr["sdpa_train"]["p50"]) - float(s["p50"])
                if eb > 0 and sb > 0:
                    row.update(eager_bwd_us=round(eb, 3), sdpa_bwd_us=round(sb, 3), ratio_bwd=round(eb / sb, 3))
            row["date"] = e["timestamp"][:10]
            out.append(row)
    return out


_BIAS_PROVIDERS = ("materialised", "build", "sdpa_mask", "build_compiled", "compiled_build_sdpa", "augmented", "flex",
                   "sdpa_nobias")


def _attention_bias(paths: list[Path], copy_bytes_per_s: float) -> list[dict]:
    """Per shape: the bias's bytes, each provider's median us, the compiled build's write rate."""
    out = []
    for path in paths:
        rows = [r for r in csv.DictReader(open_text(path)) if r["metric"] == "time"]
        by = defaultdict(dict)
        for r in rows:
            by[r["shape"]][r["provider"]] = r
        for shape, pr in by.items():
            if "build_compiled" not in pr or "build" not in pr:
                continue
            r0 = pr["build"]
            B, H, L, S, D = (int(r0[k]) for k in ("B", "H", "L", "S", "D"))
            elt = {"float16": 2, "bfloat16": 2, "float32": 4}[r0["dtype"]]
            nbytes = B * H * L * S * elt
            row = {"shape": shape, "B": B, "H": H, "L": L, "S": S, "D": D,
                   "dtype": {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[r0["dtype"]], "bias_bytes": nbytes}
            row.update({f"{p}_us": round(float(pr[p]["p50"]), 2) for p in _BIAS_PROVIDERS if p in pr})
            rate = nbytes / (float(pr["build_compiled"]["p50"]) * 1e-6)
            row.update(build_rate=float(f"{rate:.4g}"), build_fraction=round(rate / copy_bytes_per_s, 3),
                       date=r0["timestamp"][:10])
            out.append(row)
    return out


def _conv(paths: list[Path]) -> list[dict]:
    """Per convolution shape and 16-bit dtype (bench/probe_grouped_conv.py): cuDNN's time as
    PyTorch calls it and the same convolution in fp32 (cuDNN on TF32), forward + backward, each
    taken conservatively over the input layouts measured (the fastest 16-bit cuDNN, with or
    without cudnn.benchmark; the slowest fp32), and their ratio rounded down: what running the
    convolution in fp32 measured."""
    out = []
    for path in paths:
        rows = list(csv.DictReader(open_text(path)))
        by = defaultdict(list)
        for r in rows:
            # cuDNN as called and with cudnn.benchmark: one provider (the fastest 16-bit counts)
            impl = "cudnn" if r["impl"] in ("cudnn", "cudnn_benchmark") and r["dtype"] != "float32" else r["impl"]
            by[(r["shape"], r["dtype"], impl)].append(float(r["fwd_bwd_us"]))
        for shape in dict.fromkeys(r["shape"] for r in rows):
            m = re.match(r"x\[(\d+),(\d+),(\d+)\] w\[(\d+),(\d+),(\d+)\] groups (\d+)", shape)
            fp32 = by.get((shape, "float32", "cudnn"))
            if not m or not fp32:  # (1-D shapes only, as the probe writes them)
                print(f"conv rows: {shape!r} skipped (not a 1-D shape with an fp32 row)", file=sys.stderr)
                continue
            N, C, L, K, cpg, k, g = (int(x) for x in m.groups())
            for dt in ("bfloat16", "float16"):
                cud = by.get((shape, dt, "cudnn"))
                if not cud:
                    continue
                row = {"shape": shape, "N": N, "C": C, "L": L, "K": K, "channels_per_group": cpg, "kernel": k,
                       "groups": g, "spatial_dims": 1, "dtype": {"bfloat16": "bf16", "float16": "fp16"}[dt],
                       "pass": "fwd_bwd", "cudnn_us": min(cud), "fp32_us": max(fp32),
                       "fp32_speedup": math.floor(min(cud) / max(fp32) * 1000) / 1000}  # rounded down
                gemm = by.get((shape, dt, "gemm"))
                if gemm:
                    row["gemm_us"] = max(gemm)
                row["date"] = rows[0]["date"]
                out.append(row)
    return out


def _tables(name: str, rows: list[dict], paths: list[Path], what: str) -> list[str]:
    """TOML lines for `rows` as an array of tables [[name]], under a comment naming the files they
    came from and `what` they hold; none without rows."""
    if not rows:
        return []
    out = [f"# {name}: {', '.join(p.as_posix() for p in paths)} ({what})"]
    for r in rows:
        out += [f"[[{name}]]", *[f"{k} = {_toml_value(v)}" for k, v in r.items()], ""]
    return out


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else f"{v}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rows", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--cluster-rows", type=Path, nargs="*", default=[],
                   help="cluster_gemm bench rows (bench/bench_cluster_gemm.py), one file a run")
    p.add_argument("--attention-rows", type=Path, nargs="*", default=[],
                   help="op-by-op attention vs SDPA rows (bench/bench_attention_fusion.py)")
    p.add_argument("--attention-bias-rows", type=Path, nargs="*", default=[],
                   help="materialised attention bias rows (bench/bench_attention_bias.py)")
    p.add_argument("--conv-rows", type=Path, nargs="*", default=[],
                   help="a convolution in 16-bit and in fp32 (bench/probe_grouped_conv.py)")
    a = p.parse_args(argv)
    rows = list(csv.DictReader(open_text(a.rows)))
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
    cluster = _cluster_ratios(a.cluster_rows)
    if cluster:
        lines[2:2] = [f"# cluster_gemm: {', '.join(p.as_posix() for p in a.cluster_rows)} "
                      "(best verified config a run vs torch.matmul in that run; median over runs)"]
    for r in _ratios(rows) + cluster:
        lines += ["[[schedule]]", *[f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in r.items()], ""]
    lines += _tables("attention_fusion", _attention_fusion(a.attention_rows), a.attention_rows,
                     "op-by-op attention over SDPA, forward, CUDA-graph timed, median us")
    lines += _tables("attention_bias", _attention_bias(a.attention_bias_rows, c["copy_bytes_per_s"]),
                     a.attention_bias_rows,
                     "a [B, H, L, S] bias built by an eager broadcast add or by Inductor, and SDPA on it; CUDA-graph "
                     "timed, median us; build_rate: the compiled build's bytes written a second")
    lines += _tables("conv", _conv(a.conv_rows), a.conv_rows,
                     "a convolution forward + backward as PyTorch calls cuDNN in 16-bit and in fp32; median us of 10 "
                     "after 3 warm-ups; fp32_speedup: their ratio")
    a.out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
