"""An analytical model that ranks candidate configs before anything runs.

It predicts each candidate's time as the larger of a compute term and a memory term:

* compute: the busiest SM's share of MAC-loop iterations x the time of one iteration. One
  output tile keeps an SM's tensor cores busy (the SM-saturation model of DESIGN.md), so a
  data-parallel grid of T tiles costs ceil(T / SMs) tile-times; Split-K divides each tile's
  iterations by S and adds the reduction; Stream-K spreads the tail's iterations evenly over
  all SMs (like CUTLASS's cost-based Stream-K block count) and pays a fixup per split tile.
  An iteration of a BM x BN x BK step runs at the tile shape's efficiency (larger tiles reuse
  operands more; calibrated on the H200 measurements in DESIGN.md).
* memory: the fewest bytes the schedule must move (operands once, output once, plus
  partial sums) over the device bandwidth.

It is a model, not a measurement: it orders and prunes candidates so the time budget goes to
plausible ones, and the report shows its numbers so a reader sees why a config was tried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

# Fraction of the tensor-core peak one SM reaches with a single tile of this area in flight
# (BM*BN). Calibrated on the H200 (DESIGN.md): a lone 128x128x64 Triton tile per SM ran at
# ~0.58 of peak (132 tiles, K=8192, 62 us); 128x256 tiles reach ~0.64-0.75 (548-629 TFLOP/s
# Triton, 766 cuBLAS); small tiles are load-bound.
_TILE_EFF = [(256 * 128, 0.70), (128 * 128, 0.58), (64 * 128, 0.42), (64 * 64, 0.28), (32 * 64, 0.16), (0, 0.10)]

# Split partial sums are fp32: written once and read once by the reduction.
_PARTIAL_BYTES = 4
# Fixed costs per launch and per extra kernel (launch + ramp), microseconds.
_LAUNCH_US = 4.0


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
    sm_count: int = 132
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


def _iter_us(bm: int, bn: int, bk: int, dev: Device) -> float:
    per_sm = dev.peak_tflops * 1e12 / dev.sm_count
    return 2.0 * bm * bn * bk / (per_sm * tile_efficiency(bm, bn)) * 1e6


def _mem_us(nbytes: float, dev: Device) -> float:
    return nbytes / dev.bandwidth_bytes_per_s * 1e6


def predict(strategy: str, cfg: Any, M: int, N: int, K: int, elt: int, dev: Device) -> Prediction:
    bm, bn, bk = tile_of(cfg)
    tiles = math.ceil(M / bm) * math.ceil(N / bn)
    iters = math.ceil(K / bk)
    it_us = _iter_us(bm, bn, bk, dev)
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
        full = tiles // sms
        if policy == "dp" or (policy.startswith("hybrid") and tiles % sms == 0 and full > 0):
            sk_tiles = 0
        elif policy == "sk":
            sk_tiles = tiles
        else:
            extra = int(policy[len("hybrid"):] or 1) - 1 if policy.startswith("hybrid") else 0
            sk_tiles = min(tiles, tiles - full * sms + extra * sms)
        dp_tiles = tiles - sk_tiles
        dp_waves = math.ceil(dp_tiles / sms) if dp_tiles else 0
        sk_iters = math.ceil(sk_tiles * iters / sms)
        splits = min(sms, sk_tiles * iters) if sk_tiles else 0
        # Fixup: every SK program that does not finish its tile writes an fp32 partial that
        # the finishing program reads back.
        fixup_bytes = 2 * _PARTIAL_BYTES * bm * bn * max(0, splits - sk_tiles)
        compute = (dp_waves * iters + sk_iters) * it_us
        memory = _mem_us(base_bytes + fixup_bytes, dev)
        overhead = _LAUNCH_US + (2.0 if sk_tiles else 0.0)  # SK programs sync per tile
        tail = 1.0 if sk_tiles else tail
        notes = f"policy {policy}: {dp_tiles} data-parallel tiles, {sk_tiles} Stream-K tiles"
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
