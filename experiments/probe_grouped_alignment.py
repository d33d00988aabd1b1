"""Probe: what do odd sizes cost kernels/grouped_gemm.py, and do the two fixes win it back?

    python3 experiments/probe_grouped_alignment.py [--rounds 3] [--csv OUT.csv]
    TRITON_INTERPRET=1 python3 experiments/probe_grouped_alignment.py --check   # CPU: correctness only

Question (2026-12-02). `advisor diagnose --example --run` timed the bundled trace's loop of
64 small GEMMs (its shapes as the trace reports them, e.g. 237x432x261) as one grouped
launch: 90.1 us, against 29.0 us for the bench's aligned group of the same count and range
(bench/RESULTS.md). The kernel's alignment promise (ALIGN) was one number for the whole
group, taken over every M, N and K: one odd size anywhere and every operand was loaded 2
bytes at a time without cp.async. Two changes:
- the promise now covers only the sizes a vector runs along (a row-major A's K, a row-major
  B's and C's N), and the stores get their own (ALIGN_C), so a ragged M (tokens per expert
  in an MoE layer) keeps 16-byte loads and stores;
- `stage=True` copies every A_i and B_i into zero-padded, 16-byte aligned row-major slots
  first (one extra launch), so odd K and N get cp.async or TMA loads too.

Groups: the example trace's 64 shapes (read off the bundled trace by advisor itself), an
MoE-like group (64 experts, M_i ragged in 1..512, K = N = 1024) and the bench's aligned
seed-0 group. Providers, side by side in one process, inputs rotated past the L2, each
verified against a float64 reference on NaN-poisoned outputs first:
- `old promise`: the plan's ALIGN and ALIGN_C forced to 1 where the old rule gave 1 (any
  odd M, N or K): what the kernel did before;
- `promise`: the current rule, unstaged; `staged` and `staged tma`: stage=True;
- the torch.matmul loop, that loop in a CUDA graph, and torch._grouped_mm on operands padded
  once outside the timed call (bf16).
Eager do_bench medians, interleaved rounds, median of the round medians.

What it showed (H200, 2026-12-02, results/probe_grouped_alignment/, run 3 = the committed
kernels): the ragged-M group took 102 us against 997 us under the old promise (the
torch.matmul loop ~1 ms, its CUDA graph 339 us, padded torch._grouped_mm 94 us); the
example trace's odd group 81 us staged against 226 us unstaged (graph 590 us, padded
torch._grouped_mm 47 us with its padding untimed); the aligned group is unchanged unstaged
(30 us) and pays ~22 us for a copy it does not need when staged, which is why the search
space stages only groups with an odd K or N. The copy's cost on the aligned group (staged
minus unstaged): run 1, a persistent grid of 4 programs per SM, ~43 us; run 2, one program a
tile, ~35 us (its loads still ran down the columns of row-major sources); run 3, loads along
the sources' unit stride (SRC_LAYOUT), ~22 us.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_fn
from kernels import grouped_gemm as gg
from kernels import grouped_tools as ggt
from kernels.common import poison_


def example_shapes() -> list[tuple[int, int, int]]:
    """The GEMM shapes of the bundled example's small-GEMM loop, as advisor reads them."""
    from advisor.cli import example_trace
    from advisor.diagnose.diagnosis import diagnose
    from advisor.codegen.generate import parse_shape
    from advisor.traces import load_trace

    d = diagnose(load_trace(example_trace()))
    for f in d.findings:
        shapes = (f.suggestion or {}).get("shapes")
        if (f.suggestion or {}).get("schedule") == "grouped" and shapes:
            return [parse_shape(s) for s in shapes]
    raise RuntimeError("the example trace has no grouped suggestion")


def groups(small: bool) -> dict[str, list[tuple[int, int, int]]]:
    rng = random.Random(1)
    if small:  # interpreter: a few tiny members of each kind
        return {"odd": [(23, 37, 29), (9, 17, 45)], "ragged M": [(rng.randint(1, 40), 32, 48) for _ in range(3)],
                "aligned": [(16, 24, 32), (40, 8, 16)]}
    from advisor.run.bench.grouped import group_sizes

    return {"example trace (odd)": example_shapes(),
            "MoE ragged M, K=N=1024": [(rng.randint(1, 512), 1024, 1024) for _ in range(64)],
            "aligned seed 0": group_sizes(64, 128, 512, 0)}


def old_rule_align(sizes) -> bool:
    """True where the old promise (every M, N, K) would have been 1 element: any odd size."""
    return any(x % 2 for s in sizes for x in s)


def providers(sizes, dtype, device):
    cfg = gg.default_config(sizes, dtype)
    base = replace(cfg, stage=False)
    out = {"promise": (base, False)}
    if old_rule_align(sizes):
        out["old promise"] = (base, True)
    out["staged"] = (replace(base, stage=True), False)
    if device == "cuda":
        out["staged tma"] = (replace(base, stage=True, use_tma=True), False)
    return out


def setup(description: str):
    """(args, device) of a grouped probe: --rounds, --csv, --check (the CPU interpreter)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--check", action="store_true", help="correctness only (CPU interpreter)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.check else "cpu"
    if device == "cpu":
        from kernels.common import fix_interpreter_bf16_dot

        fix_interpreter_bf16_dot()
    return args, device


def group_inputs(sizes, dtype, device, seed: int):
    """(bytes, flops, input sets): enough fresh (As, Bs) sets to rotate past the L2 on a GPU."""
    nbytes = sum(2 * (M * K + K * N + M * N) for M, N, K in sizes)
    flops = sum(2 * M * N * K for M, N, K in sizes)
    sets = rotation_count(nbytes, l2_bytes(), min_sets=2) if device == "cuda" else 1
    return nbytes, flops, [gg.random_group(sizes, dtype, device, seed=seed + i) for i in range(sets)]


def checked_launches(inputs, cfg, *, old_promise: bool = False):
    """One plan per input set, the first verified on poisoned outputs: (launchers, rel. error, plan)."""
    plans = []
    for As, Bs in inputs:
        plan = gg.prepare(As, Bs, cfg)
        if old_promise:
            plan.align = plan.align_c = 1
        plans.append(plan)
    for c in plans[0].outs:
        poison_(c)
    err = gg.check_outputs(*inputs[0], plans[0].launch())
    return [p.launch for p in plans], err, plans[0]


def time_rounds(calls: dict, rounds: int) -> dict[str, list[float]]:
    """Eager do_bench medians (us) of every provider, interleaved over `rounds` rounds."""
    times: dict[str, list[float]] = {p: [] for p in calls}
    for _ in range(rounds):
        for p, fns in calls.items():
            times[p].append(time_fn(rotating(fns), method="do_bench", warmup_ms=25, rep_ms=100).median_ms * 1e3)
    return times


def write_csv(path, rows: list[dict]) -> None:
    if path and rows:
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def main() -> int:
    args, device = setup(__doc__.split("\n")[0])
    dtype = torch.bfloat16
    rows = []
    for gname, sizes in groups(device == "cpu").items():
        nbytes, flops, inputs = group_inputs(sizes, dtype, device, seed=7)
        calls: dict[str, list] = {}
        for pname, (cfg, force_old) in providers(sizes, dtype, device).items():
            calls[pname], err, plan = checked_launches(inputs, cfg, old_promise=force_old)
            print(f"{gname:26} {pname:12} ok  rel_err {err:.2e}  {plan!r}", flush=True)
        if device == "cuda":
            loops = [ggt.torch_loop(As, Bs, [torch.empty(M, N, dtype=dtype, device=device) for M, N, _ in sizes])
                     for As, Bs in inputs]
            calls["torch.matmul loop"] = loops
            graphs = []
            for fn in loops:
                fn()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                graphs.append(g.replay)
            calls["loop in a CUDA graph"] = graphs
            gmm = [ggt.torch_grouped_mm(As, Bs) for As, Bs in inputs]
            if all(gmm):
                calls["torch._grouped_mm padded (pad untimed)"] = gmm
        if device == "cpu":
            continue
        times = time_rounds(calls, args.rounds)
        loop_us = statistics.median(times["torch.matmul loop"])
        print(f"\n{gname}: {len(sizes)} GEMMs, {flops / 1e9:.2f} GFLOP, {nbytes / 1e6:.1f} MB, {len(inputs)} input sets")
        for p, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            us = statistics.median(ts)
            print(f"  {p:40} {us:9.1f} us  {flops / us / 1e6:7.1f} TFLOP/s  x{loop_us / us:6.2f} vs the loop   "
                  f"rounds {' '.join(f'{t:.1f}' for t in ts)}")
            rows.append({"group": gname, "provider": p, "median_us": round(us, 2), "tflops": round(flops / us / 1e6, 2),
                         "rounds": " ".join(f"{t:.2f}" for t in ts), "gemms": len(sizes), "device": torch.cuda.get_device_name(),
                         "torch": torch.__version__})
        print(flush=True)
    write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
