"""Probe: time hand-picked configs of our schedules side by side with torch.matmul (H200).

    python3 experiments/probe_configs.py VARIANTS.json [--shapes 1664x1408x8192,...] [--rounds 3] [--out DIR]

For questions a schedule's search space does not ask: "would 5 stages beat 4 here?", "is a
128x256 Split-K tile faster on this skinny shape?". VARIANTS.json holds
{"shapes": ["MxNxK", ...], "dtype": "bf16"?, "variants": [{"schedule": "stream_k_gemm",
"config": {...}, "shapes": [...]?}, ...]}; a variant's own "shapes" limits it to those shapes.
"dtype" is bf16 (the default), fp16 or fp32 (torch.matmul then runs with tf32, as our
schedules do). torch.matmul always runs first; the first variant of each shape is the
baseline of the "x base" column.

Method (as bench_gemm.py's final re-timing): every variant is checked first (fresh random
inputs of the file's dtype, NaN-poisoned output, float64 reference, the dtype's tolerance); a config the
schedule refuses for the shape (ValueError) or that fails the check is reported and
skipped. Then all are timed with the CUDA-graph timer (GPU time per call; inputs rotate over
more than twice the L2) in --rounds interleaved rounds and the median of the round medians
is kept. Long-format rows go to DIR/probe_configs.csv and a table is printed.

The variant files of past questions are in experiments/probes/, their results (with device, date
and commit) in experiments/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import (
    append_csv,
    gemm_bytes,
    gemm_flops,
    make_row,
    new_run_id,
    parse_shape,
)
from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_graph
from advisor.run.bench.verify import (
    Checker,
    CheckFailed,
    dtype_from_name,
    make_generator,
    random_matrix,
)
from advisor.codegen.kernel_lib import load

DTYPES = ("bf16", "fp16", "fp32")


def load_variants(path: Path) -> tuple[list[str], list[dict], str]:
    """(default shapes, variants, dtype) from a variants file; configs are built here, so that
    a misspelled knob or dtype fails before any GPU work."""
    spec = json.loads(Path(path).read_text())
    dtype = spec.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise ValueError(f"{path}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    variants = []
    for i, v in enumerate(spec.get("variants", [])):
        if "schedule" not in v or "config" not in v:
            raise ValueError(f"{path}: variant {i} needs 'schedule' and 'config'")
        module = load(v["schedule"])
        try:
            config = module.Config(**v["config"])
        except TypeError as exc:
            raise ValueError(f"{path}: variant {i} ({v['schedule']}): {exc}") from exc
        variants.append({"provider": v["schedule"].removesuffix("_gemm"), "module": module, "config": config,
                         "shapes": set(v.get("shapes") or [])})
    if not variants:
        raise ValueError(f"{path}: no variants")
    return list(spec.get("shapes", [])), variants, dtype


def time_side_by_side(shape: str, todo: list[tuple], rounds: int, rep_ms: float, dtype: str = "bf16") -> list[tuple]:
    """The probes' method. `todo` holds (key, label, call(a, b, out)). Each call is checked
    against a float64 reference on fresh random `dtype` inputs with its output NaN-poisoned; a
    refused or failing one is reported and skipped. The rest are graph-timed over input sets
    rotating past the L2, in `rounds` interleaved rounds. Returns (key, label, rel_err,
    round medians in us) for each that ran, in `todo` order."""
    import torch

    M, N, K = parse_shape(shape)
    tdt = dtype_from_name(dtype)
    checker = Checker(M, N, K, dtype, "cuda", seed=1)
    n_sets = rotation_count(tdt.itemsize * (M * K + K * N + M * N), l2_bytes())
    g = make_generator("cuda", 99)
    sets = [(random_matrix(M, K, tdt, "cuda", g), random_matrix(K, N, tdt, "cuda", g))
            for _ in range(n_sets)]
    outs = [torch.empty(M, N, dtype=tdt, device="cuda") for _ in range(n_sets)]
    live = []
    for key, label, call in todo:
        try:
            err = checker.check(call)
        except (CheckFailed, ValueError, RuntimeError) as exc:  # a refused or failing variant is reported
            print(f"{shape:>16} {label}: SKIPPED {type(exc).__name__}: {exc}", flush=True)
            continue
        fn = rotating([lambda a=a, b=b, o=o, call=call: call(a, b, o) for (a, b), o in zip(sets, outs)])
        live.append((key, label, err, fn, []))
    for _ in range(rounds):
        for *_, fn, medians in live:
            medians.append(time_graph(fn, rep_ms=rep_ms).median_ms * 1e3)
    return [(key, label, err, medians) for key, label, err, _, medians in live]


def schedule_call(module, config):
    """call(a, b, out) for torch.matmul (module None) or a schedule's matmul with `config`."""
    if module is None:
        import torch

        return lambda a, b, out: torch.matmul(a, b, out=out)
    return lambda a, b, out: module.matmul(a, b, config, out=out)


def probe_shape(shape: str, variants: list[dict], rounds: int, rep_ms: float, env: dict,
                dtype: str = "bf16") -> list[dict]:
    """Check, then time side by side, torch.matmul and the variants that apply to `shape`."""
    M, N, K = parse_shape(shape)
    todo = [{"provider": "torch.matmul", "module": None, "config": None}]
    todo += [v for v in variants if not v["shapes"] or shape in v["shapes"]]
    timed = time_side_by_side(
        shape, [(v, f"{v['provider']} {'-' if v['config'] is None else v['config'].describe()}",
                 schedule_call(v["module"], v["config"])) for v in todo], rounds, rep_ms, dtype)
    rows = []
    for v, label, err, medians in timed:
        row = make_row(suite="probe", shape=shape, M=M, N=N, K=K, dtype=dtype, provider=v["provider"],
                       config=v["config"] or "", status="ok", phase="final",
                       median_ms=statistics.median(medians) / 1e3, flops=gemm_flops(M, N, K),
                       bytes_moved=gemm_bytes(M, N, K, dtype_from_name(dtype).itemsize), rel_err=err,
                       timer="graph", env=env)
        row["rounds_us"] = ";".join(f"{m:.1f}" for m in medians)
        row["describe"] = "-" if v["config"] is None else v["config"].describe()
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("variants", type=Path, help="variants file (see experiments/probes/)")
    ap.add_argument("--shapes", default=None, help="comma list of MxNxK (default: the file's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=float, default=40)
    ap.add_argument("--out", type=Path, default=Path("probe-configs"))
    args = ap.parse_args()
    shapes, variants, dtype = load_variants(args.variants)
    if args.shapes:
        shapes = args.shapes.split(",")
    if not shapes:
        ap.error("no shapes: give --shapes or a 'shapes' list in the variants file")
    import torch
    import triton

    torch.backends.cuda.matmul.allow_tf32 = True  # fp32: cuBLAS with tf32, as our schedules
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"device": torch.cuda.get_device_name(), "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
           "run_id": new_run_id(), "torch": torch.__version__, "triton": triton.__version__}
    for shape in shapes:
        rows = probe_shape(shape, variants, args.rounds, args.rep_ms, env, dtype)
        append_csv(args.out / "probe_configs.csv", rows)
        cublas = rows[0]["median_us"]
        base = rows[1]["median_us"] if len(rows) > 1 else cublas
        for r in rows:
            print(f"{shape:>16} {r['provider']:>12} {r['median_us']:8.1f} us {r['tflops']:6.1f} TF "
                  f"x{cublas / r['median_us']:.3f} cuBLAS x{base / r['median_us']:.3f} base "
                  f"[{r['rounds_us']}] {r['describe']}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
