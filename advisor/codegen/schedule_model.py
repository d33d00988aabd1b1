"""An analytical model that ranks candidate configs before anything runs.

It predicts each candidate's time as the larger of a compute term and a memory term:

* compute: the busiest SM's share of MAC-loop iterations x the time of one iteration. One
  output tile keeps an SM's tensor cores busy (the SM-saturation model of DESIGN.md), so a
  data-parallel grid of T tiles costs ceil(T / SMs) tile-times; Split-K divides each tile's
  iterations by S and adds the reduction; Stream-K spreads the tail's iterations over all
  SMs (contiguous ranges like CUTLASS's cost-based Stream-K block count, or equal K-chunks a
  tile when `aligned`) and pays for handing in and reducing the partial tiles: the
  per-program timestamps of experiments/probe_stream_k_phases.py showed these steps, not the MAC
  loops, setting the hybrid's overhead.
  An iteration of a BM x BN x BK step runs at the tile shape's efficiency (larger tiles reuse
  operands more; calibrated on our H200 benchmark rows).
* memory: the fewest bytes the schedule must move (operands once, output once, plus
  partial sums) over the device bandwidth.

It is a model, not a measurement: it orders and prunes candidates so the time budget goes to
plausible ones, and the report shows its numbers so a reader sees why a config was tried.
bench/model_check.py measures how well it orders them against the committed H200 rows
(2026-11-29: the measured best config among its first three for 27 of 33 (shape, strategy)
pairs, Kendall tau 0.59; 20 and 0.37 before the Stream-K hand-off and the aligned layout
were modelled).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..basics import DEFAULT_SM_COUNT

# Fraction of the tensor-core peak one SM reaches with a single tile of this area in flight
# (BM*BN). Recalibrated on the H200 (2026-11-29, graph-timed, bench/results/h200.csv.gz): a wave
# of 128x128x64 tiles at K=8192 takes ~43 us (0.82 of peak per SM, pointer or TMA loads,
# 4 stages), a wave of 128x256 tiles ~78 us (0.90). The first calibration (0.58 and 0.70,
# eager do_bench) favoured 128x256 tiles too much. Small tiles are load-bound.
_TILE_EFF = [(256 * 128, 0.90), (128 * 128, 0.82), (64 * 128, 0.42), (64 * 64, 0.28), (32 * 64, 0.16), (0, 0.10)]

# Split partial sums are fp32: written once and read once by the reduction.
_PARTIAL_BYTES = 4
# Fixed costs per launch and per extra kernel (launch + ramp), microseconds.
_LAUNCH_US = 4.0
# Handing a partial tile to another program: a fixed part (fence, counter atomic) plus the
# fp32 tile at one SM's share of the device bandwidth. H200 timestamps: 3 us for a 128x128
# partial, 5 us for 128x256; the cooperative claims cost about as much again.
_HANDOFF_US = 1.0
# Contiguous Stream-K ranges start at staggered K offsets, so concurrent programs rarely share
# operand panels in the L2: Nsight Compute on the H200 saw the tensor pipe 64% busy in them
# against 95% in data-parallel tiles, and all-Stream-K launches on 1664x1408x8192 took about
# twice the data-parallel time of their iterations. Their MAC loops run at this fraction of
# a tile's rate.
_CONTIGUOUS_SK_RATE = 0.55


def _knob(cfg: Any, *names: str, default=None):
    for n in names:
        if isinstance(cfg, dict) and n in cfg:
            return cfg[n]
        if hasattr(cfg, n):
            return getattr(cfg, n)
    return default


def tile_of(cfg: Any) -> tuple[int, int, int]:
    return (
        int(_knob(cfg, "BLOCK_M", "block_m", default=128)),
        int(_knob(cfg, "BLOCK_N", "block_n", default=128)),
        int(_knob(cfg, "BLOCK_K", "block_k", default=64)),
    )


def tile_efficiency(bm: int, bn: int) -> float:
    area = bm * bn
    for threshold, eff in _TILE_EFF:
        if area >= threshold:
            return eff
    return _TILE_EFF[-1][1]


@dataclass(frozen=True)
class Device:
    """What the model needs to know about the GPU."""

    name: str = "NVIDIA H200"
    sm_count: int = DEFAULT_SM_COUNT
    peak_tflops: float = 989.0  # dense bf16/fp16 tensor rate (datasheet)
    bandwidth_bytes_per_s: float = 4.3e12  # measured device-to-device copy on the H200
    compute_capability: str = "9.0"
    smem_per_block_bytes: int = 227 * 1024


@dataclass(frozen=True)
class Prediction:
    strategy: str
    config: Any
    predicted_us: float
    compute_us: float
    memory_us: float
    tiles: int
    waves: float
    tail_efficiency: float
    notes: str = ""
    extra: dict = field(default_factory=dict, hash=False)

    def row(self) -> dict:
        return {
            "strategy": self.strategy,
            "config": self.config if isinstance(self.config, dict) else getattr(self.config, "__dict__", str(self.config)),
            "predicted_us": round(self.predicted_us, 2),
            "compute_us": round(self.compute_us, 2),
            "memory_us": round(self.memory_us, 2),
            "tiles": self.tiles,
            "waves": round(self.waves, 3),
            "tail_efficiency": round(self.tail_efficiency, 3),
            "notes": self.notes,
        }


def _iter_us(bm: int, bn: int, bk: int, dev: Device, elt: int = 2) -> float:
    per_sm = tensor_tflops(dev, elt) * 1e12 / dev.sm_count
    return 2.0 * bm * bn * bk / (per_sm * tile_efficiency(bm, bn)) * 1e6


def tensor_tflops(dev: Device, elt: int) -> float:
    """The dense tensor-core rate for inputs of `elt` bytes: fp32 inputs run as tf32, at half
    the 16-bit rate (H100/H200 datasheet: 494.7 against 989 TFLOP/s). Our kernels reach about
    the same fraction of either: 8192^3 in 3244 us with tf32 (69% of 494.7) and in ~1600 us
    with bf16 (70% of 989) on the H200 (docs/results.md, 2026-12-01)."""
    return dev.peak_tflops / 2 if elt >= 4 else dev.peak_tflops


def _mem_us(nbytes: float, dev: Device) -> float:
    return nbytes / dev.bandwidth_bytes_per_s * 1e6


def _predict_cluster_gemm(cfg: Any, M: int, N: int, K: int, dev: Device) -> Prediction:
    """cluster_gemm prices itself (kernels/gluon_gemm_configs.estimate_us: its measured step
    times, its Stream-K plan and fixup), pure Python like this module."""
    from .kernel_lib import load

    gc = load("gluon_gemm_configs")
    c = gc.Config(**cfg) if isinstance(cfg, dict) else cfg
    us = gc.estimate_us(c, M, N, K, dev.sm_count)
    tiles = gc.cdiv(M, c.cluster_m) * gc.cdiv(N, c.BLOCK_N)
    waves = tiles / gc.programs(c, dev.sm_count)
    s, skp = gc.sk_plan(tiles, gc.cdiv(K, c.BLOCK_K), gc.programs(c, dev.sm_count), c.stream_k)
    return Prediction("cluster_gemm", cfg, us, us, 0.0, tiles, waves, 1.0 if s else waves / math.ceil(waves),
                      f"{c.describe()}: " + (f"{s} Stream-K tiles over {skp} programs" if s else "data-parallel"))


def predict(strategy: str, cfg: Any, M: int, N: int, K: int, elt: int, dev: Device) -> Prediction:
    if strategy == "cluster_gemm":
        return _predict_cluster_gemm(cfg, M, N, K, dev)
    bm, bn, bk = tile_of(cfg)
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    iters = math.ceil(K / bk)
    it_us = _iter_us(bm, bn, bk, dev, elt)
    sms = dev.sm_count
    waves = tiles / sms
    tail = waves / math.ceil(waves)
    base_bytes = elt * (M * K + K * N + M * N)
    # Each tile row re-reads B and each tile column re-reads A unless L2 catches it; count the
    # operands once (grouped order keeps most re-reads in L2).
    notes = ""
    if strategy == "split_k":
        s = int(_knob(cfg, "SPLIT_K", "split_k", default=1))
        units = tiles * s
        per_unit = math.ceil(iters / s)
        compute = math.ceil(units / sms) * per_unit * it_us
        partial = 2 * _PARTIAL_BYTES * M * N * s if s > 1 else 0
        memory = _mem_us(base_bytes + partial, dev)
        overhead = _LAUNCH_US * (2 if s > 1 else 1)
        waves = units / sms
        tail = waves / math.ceil(waves)
        notes = f"S={s}: {units} units of {per_unit} iterations"
    elif strategy == "stream_k":
        policy = str(_knob(cfg, "policy", default="hybrid1"))
        sk_tiles = _sk_tile_count(policy, tiles, sms)
        dp_tiles = tiles - sk_tiles
        dp_waves = math.ceil(dp_tiles / sms) if dp_tiles else 0
        tile_bytes = _PARTIAL_BYTES * bm * bn
        sm_bytes_per_us = dev.bandwidth_bytes_per_s / sms / 1e6  # one SM's share
        aligned = bool(_knob(cfg, "aligned", default=False))
        deterministic = bool(_knob(cfg, "deterministic", default=True))
        if not sk_tiles:
            sk_us, handoff, fixup_bytes = 0.0, 0.0, 0.0
            notes = f"policy {policy}: {dp_tiles} data-parallel tiles"
        elif aligned:
            # SK_SPLIT_M x SK_SPLIT_N cut each Stream-K tile into pieces first: smaller partials
            # to hand in and claim (or, whole_pieces, none), but the pieces' MAC loops run at a
            # smaller tile's rate
            split_m = int(_knob(cfg, "SK_SPLIT_M", default=1))
            split_n = int(_knob(cfg, "SK_SPLIT_N", default=1))
            # edge_first: the ragged last tile column heads the region, each of its tiles only
            # the column pieces that reach into C
            edge, edge_cols = 0, 0
            if _knob(cfg, "edge_first", default=False) and N % bn and N > bn:
                edge, edge_cols = min(math.ceil(M / bm), sk_tiles), math.ceil((N % bn) / (bn // split_n))
            pieces = (sk_tiles - edge) * split_m * split_n + edge * split_m * edge_cols
            tile_bytes /= split_m * split_n
            chunks = 1 if _knob(cfg, "whole_pieces", default=False) else aligned_chunks(pieces, iters, sms)
            units = pieces * chunks
            rounds = math.ceil(units / min(sms, units))
            sk_us = rounds * math.ceil(iters / chunks) * _iter_us(bm // split_m, bn // split_n, bk, dev, elt)
            # the Stream-K tiles' operand panels are read at the same time by every chunk:
            # the phase cannot beat reading them once
            rows, cols = _grouped_span(sk_tiles - edge, M, N, bm, bn)
            if edge:  # the ragged column's rows and its (narrower) column panel
                rows, cols = max(rows, edge), cols + edge_cols / split_n
            sk_us = max(sk_us, _mem_us(elt * K * (bm * rows + bn * cols), dev))
            split = chunks > 1
            # each unit hands in its partial, then (cooperative fixup) claims one row slice of a
            # tile: deterministic, summed over all the tile's partials (a tile's worth of
            # reads); atomic, taken out of the tile's running sum (1/chunks of a tile). The
            # TMA hand-in and helper claims (stream_k tma_hand_in, helper_claims) are priced
            # like the per-thread hand-in and cooperative claims: they measured within a few
            # percent of them on the H200 (2026-12-01), well inside the pruning ratio
            claim_bytes = tile_bytes if deterministic else tile_bytes / chunks
            handoff = rounds * (2 * _HANDOFF_US + (tile_bytes + claim_bytes) / sm_bytes_per_us) if split else 0.0
            fixup_bytes = (2 * tile_bytes * (units if deterministic else pieces)) if split else 0
            cut = f" x {split_m * split_n} pieces of {bm // split_m}x{bn // split_n}" if split_m * split_n > 1 else ""
            cut += f" ({pieces} pieces: the ragged column's {edge} tiles first)" if edge else ""
            notes = (f"policy {policy}, aligned: {dp_tiles} data-parallel tiles, {sk_tiles} Stream-K tiles{cut} "
                     f"in {chunks} K-chunk{'s' if chunks > 1 else ''} ({rounds} round{'s' if rounds > 1 else ''} of units)")
        else:
            programs = min(sms, sk_tiles * iters)
            sk_us = math.ceil(sk_tiles * iters / programs) * it_us / _CONTIGUOUS_SK_RATE
            # ranges of q iterations: a tile is split wherever a range boundary falls inside
            # it, which is almost everywhere unless q is a whole number of tiles
            q = sk_tiles * iters / programs
            whole = (sk_tiles * iters) % programs == 0 and (sk_tiles * iters // programs) % iters == 0
            contributors = 1 if whole else min(programs, math.ceil(iters / q) + 1)
            # a contributor writes its partial; the last arriver of a tile then reads every
            # other contributor's partial alone (deterministic: 12 of them took ~21 us on the
            # H200), or one running sum (atomic)
            reads = (contributors - 1) if deterministic else 1
            handoff = (_HANDOFF_US + (1 + reads) * tile_bytes / sm_bytes_per_us) if contributors > 1 else 0.0
            fixup_bytes = 2 * tile_bytes * sk_tiles * (contributors - 1)
            notes = f"policy {policy}: {dp_tiles} data-parallel tiles, {sk_tiles} Stream-K tiles"
        compute = dp_waves * iters * it_us + sk_us + handoff
        memory = _mem_us(base_bytes + fixup_bytes, dev)
        overhead = _LAUNCH_US
        tail = 1.0 if sk_tiles else tail
    else:
        # dp, persistent, warp_specialization: data-parallel makespan.
        compute = math.ceil(waves) * iters * it_us
        memory = _mem_us(base_bytes, dev)
        overhead = _LAUNCH_US
        if strategy in ("persistent", "warp_specialization"):
            overhead = _LAUNCH_US * 0.5  # one launch of #SMs programs, prologue paid once
        if strategy == "warp_specialization" and bool(_knob(cfg, "warp_specialize", default=True)):
            compute *= 0.93  # producer/consumer overlap: a prior, measured 0-15% here
    predicted = max(compute, memory) + overhead
    return Prediction(strategy, cfg, predicted, compute, memory, tiles, waves, tail, notes)


def _sk_tile_count(policy: str, tiles: int, sms: int) -> int:
    """Tiles in the Stream-K region (kernels/stream_k_gemm.py's sk_tile_count)."""
    if policy == "dp":
        return 0
    if policy == "sk" or not policy.startswith("hybrid"):
        return tiles
    extra_waves = int(policy[len("hybrid"):] or 1) - 1
    return min(tiles, tiles % sms + extra_waves * sms)


def aligned_chunks(sk_tiles: int, iters: int, sms: int, max_chunks: int = 8) -> int:
    """K-chunks a Stream-K tile is cut into in the aligned layout: the rule of
    kernels/stream_k_gemm.aligned_chunks (a test keeps the two equal)."""
    if 2 * sk_tiles <= sms:
        return max(1, min(iters, sms // sk_tiles))
    best, best_span = 1, float(math.ceil(sk_tiles / sms))
    for chunks in range(2, min(iters, max_chunks) + 1):
        span = math.ceil(sk_tiles * chunks / sms) / chunks
        if span < best_span - 1e-9:
            best, best_span = chunks, span
    return best


def _grouped_span(first_tiles: int, M: int, N: int, bm: int, bn: int, group_m: int = 8) -> tuple[int, int]:
    """Distinct (row-tiles, column-tiles) among the first `first_tiles` tiles in grouped order
    (bands of group_m row-tiles, numbered down each band, then across). One step a band."""
    num_m, num_n = math.ceil(M / bm), math.ceil(N / bn)
    rows = cols = first = 0
    left = first_tiles
    while left > 0 and first < num_m:
        height = min(num_m - first, group_m)
        take = min(left, height * num_n)
        rows += min(height, take)
        cols = max(cols, math.ceil(take / height))
        left -= take
        first += height
    return rows, cols


def rank(
    strategy: str,
    configs: Iterable[Any],
    M: int,
    N: int,
    K: int,
    elt: int = 2,
    dev: Device | None = None,
    prune_ratio: float = 1.5,
    keep_at_least: int = 2,
) -> list[Prediction]:
    """Candidates sorted by predicted time, dropping those predicted worse than
    `prune_ratio` x the best (always keeping `keep_at_least`)."""
    dev = dev or Device()
    preds = sorted((predict(strategy, c, M, N, K, elt, dev) for c in configs), key=lambda p: p.predicted_us)
    if not preds:
        return []
    best = preds[0].predicted_us
    kept = [p for i, p in enumerate(preds) if i < keep_at_least or p.predicted_us <= prune_ratio * best]
    return kept


def suggest_split_k(M: int, N: int, K: int, bm: int, bn: int, bk: int, sms: int, min_iters: int = 8, max_split: int = 32) -> int:
    """S such that tiles x S is about one wave, keeping >= min_iters BLOCK_K steps per split."""
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    s = max(1, sms // tiles)
    cap = max(1, min(max_split, math.ceil(K / bk) // min_iters))
    return max(1, min(s, cap))


def stream_k_policies(tiles: int, sms: int) -> list[str]:
    """Policies worth timing for a tile count (Stream-K++'s pruning): whole waves need none
    of the Stream-K machinery; under one wave only all-SK makes sense; otherwise the
    data-parallel body plus a 1- to 4-wave Stream-K tail, as far as there are waves to give."""
    if tiles % sms == 0:
        return ["dp"]
    if tiles < sms:
        return ["sk", "dp"]
    full = tiles // sms
    return ["hybrid1"] + [f"hybrid{n}" for n in range(2, min(4, full + 1) + 1)] + ["sk", "dp"]
