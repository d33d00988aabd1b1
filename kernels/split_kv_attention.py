"""Split-KV decode attention (flash-decoding): cut the KV sequence into chunks so that a few
query tokens fill the GPU.

What
    O = softmax(Q K^T * scale) V for decode: a handful of query positions per sequence (Lq in
    1..16) against a long KV cache of S keys. A FlashAttention forward launches one program
    per (batch, head, block of queries); in decode that is B x H programs (32 at batch 1 with
    32 heads) on 132 SMs, each walking all S keys, so most SMs idle while a few stream the
    cache. Here program (split, row block, batch x kv-head) walks one chunk of the keys,
    [split x CHUNK, (split + 1) x CHUNK), for every query head that shares that kv-head
    (grouped-query attention: Hq / Hkv query heads read the same K and V, so one program loads
    each K/V tile once for all of them, as rows of one tile with the Lq query positions), and
    writes its fp32 partial output, normalised by its own softmax sum, plus the log-sum-exp of
    its scores (base 2). The splits of each output row are then combined,
    O = sum_s 2^(lse_s - lse) O_s with lse = log2 sum_s 2^lse_s, by one of two steps (the
    `combine` knob):

    "last_arriver"  each program bumps an arrival counter for its (batch, kv-head, row block)
                    after storing its partial (acq_rel); the program that arrives last reads
                    every split's partial back through L2, in split order, with an online
                    rescale, stores O and resets the counter. One launch: no second kernel
                    and no launch gap between them, which matters at 8k keys where the whole
                    step is ~10 us. No program ever waits for another (the CPU interpreter,
                    which runs programs one at a time, runs the same code).
    "kernel"        a second, small kernel with one program per output row.

    Both sum the splits in split order: deterministic. With one split the first kernel stores
    the output itself and no combine runs.

    The `stream` knob swaps the (split, row block, unit) grid for Stream-K's: CTAS_PER_SM x SMs
    programs, the units' key groups laid end to end and cut into that many equal shares, so
    every SM streams the same number of bytes whatever B x Hkv is (a split grid of 192
    programs on 132 SMs leaves 60 SMs with twice the work of the others). A program whose
    share crosses into the next unit carries on there; the programs of one unit combine by
    the last arriver as above (Lean Attention applies Stream-K to attention this way).

    Causal semantics for Lq > 1: the queries are the LAST Lq positions of the sequence, so
    query i (0-based) sees keys 0 .. S - Lq + i (what a speculative-decoding verify step or a
    chunk of prefill appended to a cache needs). Lq = 1 sees every key. S >= Lq is required
    (the KV cache holds the queries' own positions).

When it wins
    Decode is memory-bound: the floor is reading K and V once, 2 x B x Hkv x S x D x element
    bytes at the device's bandwidth (33.5 MB at batch 1, 8 kv-heads, D 128, S 8192 in bf16).
    It wins where B x Hkv (x row blocks) programs under-fill the SMs and S is long; the
    split count follows FlashAttention's public heuristic (`num_splits_for`): the smallest
    split whose wave efficiency n / (ceil(n / slots) x slots), n = programs, is within 85% of
    the best over candidate splits, with at least MIN_CHUNK keys a split. K and V tiles are
    BLOCK_N keys x D, 16-byte vector loads along D, software-pipelined NUM_STAGES deep.

Caveats
    - The partials make a round trip through memory: rows x splits x (D + 1) x 4 bytes
      (1 MB at batch 1, 32 query heads, 64 splits, D 128), small next to the cache.
    - Query rows pad to BLOCK_H >= 16 (the tensor-core minimum): with one query head per
      kv-head and Lq = 1, 15 of 16 rows are padding; the MMA has slack, the bytes do not change.
    - D must be 16..256; a D that is not a power of two runs with masked loads along D
      (slower: no 16-byte vectors).
    - fp32 inputs multiply as tf32 on the GPU's tensor cores (about 1e-3 relative error in the
      scores), like the GEMM schedules; the CPU interpreter computes in plain fp32.
    - The combine is deterministic (splits summed in order); so is the whole kernel.
    - "last_arriver" keeps per-(batch, kv-head, row block) counters in kernels/common.py's
      ZeroedScratch pool (per device and stream); the kernel leaves them zeroed. A launch
      killed mid-flight leaves them dirty (SCRATCH.clear()).

Source of the idea
    Flash-decoding (Tri Dao, Daniel Haziza, Francisco Massa, Grigory Sizov, "Flash-Decoding for
    long-context inference", PyTorch blog, 2023) and FlashAttention 2's split-KV path with its
    num_splits heuristic (Dao, arXiv 2307.08691; the heuristic's rule as described above). The
    online softmax is FlashAttention's (Dao et al., arXiv 2205.14135). The stream schedule:
    Stream-K (Osama et al., arXiv 2301.03598) as Lean Attention applies it to decode
    (Sanovar et al., arXiv 2405.10480).
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from .common import SCRATCH, SMEM_PER_BLOCK_SM90, SUPPORTED_DTYPES, cdiv, fix_interpreter_bf16_dot, num_sms
from .split_kv_tuning import (SPLIT_ALIGN, candidate_knobs, num_splits_for, pipeline_bytes, rows_per_program,
                              structure_candidates, table_knobs, work_units)

try:  # Triton >= 3.4: host tensor descriptors (TMA) and grid dependency control (PDL)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: pointer loads, no PDL
    TensorDescriptor = gdc_wait = gdc_launch_dependents = None

LOG2E = 1.4426950408889634
COMBINES = ("last_arriver", "kernel")
MAX_LQ = 16  # query positions per sequence: decode and short speculative/verify steps
MIN_D, MAX_D = 16, 256  # tl.dot needs K >= 16; D 256 keeps one K or V tile within 64 KB in bf16

# Per-dtype tolerance on ||O - ref|| / ||ref|| (Frobenius) against a float64 softmax of the same
# (already rounded) inputs. The probabilities are fp32 and rounded to the input dtype for the
# P @ V product, so each term carries one rounding of P and the output one more:
TOLERANCE = {
    # fp16: u = 2^-11; P and output rounding ~ 2 x 2.8e-4 rms, 4x margin.
    torch.float16: 2e-3,
    # bf16: u = 2^-8; P rounding ~ 2.3e-3 rms per term (averages down over keys) plus output
    # rounding 2.3e-3 rms; 2x margin on their sum.
    torch.bfloat16: 1e-2,
    # fp32: tf32 on the GPU (u = 2^-11 per operand in both products, ~5e-4 rms each); the
    # interpreter's plain fp32 lands near 1e-7.
    torch.float32: 2e-3,
}


def attention_launch_metadata(hook_name: str):
    """A Triton `launch_metadata` hook naming the kernel and the problem, with the bytes it must
    move (K and V once), so profiles of our own kernel are diagnosable."""

    def hook(grid, kernel, args):
        B, Hkv, S, D = args["B"], args["H_KV"], args["S"], args["D"]
        k = getattr(args.get("k_ptr"), "base", args.get("k_ptr"))  # a TensorDescriptor carries its tensor
        elt = k.element_size() if hasattr(k, "element_size") else 2
        return {
            "name": f"{hook_name} [B={B}, Hkv={Hkv}, S={S}, D={D}, {'programs' if 'max_segments' in args else 'splits'}"
                    f"={args['num_splits']}]",
            "bytes": 2 * B * Hkv * S * D * elt,
        }

    return hook


# ---------------------------------------------------------------------------------- Knobs


@dataclass(frozen=True)
class Config:
    """Every knob of the split-KV schedule."""

    BLOCK_N: int = 64  # keys per K/V tile: 16 KB a tile at D 128 in bf16
    BLOCK_H: int = 64  # most query rows (heads of a group x Lq) per program; fewer rows pad to >= 16
    num_warps: int = 4
    num_stages: int = 3  # K/V tiles in flight per program (memory-bound: deep)
    NUM_SPLITS: int = 0  # KV chunks; 0: num_splits_for (the wave-efficiency rule) at launch
    MIN_CHUNK: int = 256  # fewest keys a split walks (caps the split count at S / MIN_CHUNK)
    CTAS_PER_SM: int = 2  # program slots per SM the wave rule fills (FlashAttention 2 uses 2 for 4-warp blocks)
    COMBINE_CHUNK: int = 16  # "kernel": splits the combine kernel loads at once
    combine: str = "last_arriver"  # "last_arriver" (one launch) | "kernel" (module docstring)
    tma: bool = False  # K/V through TMA tensor descriptors where the layout allows, else pointer loads
    pdl: bool = False  # "kernel" combine: launch it behind the split kernel (programmatic dependent launch, sm_90+)
    # The "stream" schedule (stream_kv_kernel): CTAS_PER_SM x SMs programs, each walking an equal
    # share of all (unit, key) work end to end; NUM_SPLITS unused (0), the last arriver combines.
    stream: bool = False

    def __post_init__(self):
        for name in ("BLOCK_N", "BLOCK_H", "COMBINE_CHUNK"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"{name}={v!r}: must be a power of two >= 16")
        for name in ("num_warps", "num_stages", "MIN_CHUNK", "CTAS_PER_SM"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: must be a positive integer")
        if self.num_warps & (self.num_warps - 1) or self.num_warps > 16:
            raise ValueError(f"num_warps={self.num_warps!r}: must be 1, 2, 4, 8 or 16")
        if self.combine not in COMBINES:
            raise ValueError(f"combine={self.combine!r}: must be one of {COMBINES}")
        if not isinstance(self.NUM_SPLITS, int) or self.NUM_SPLITS < 0:
            raise ValueError(f"NUM_SPLITS={self.NUM_SPLITS!r}: must be 0 (automatic) or a positive integer")
        if self.stream and (self.combine != "last_arriver" or self.NUM_SPLITS or self.pdl):
            raise ValueError("stream=True sizes its grid by CTAS_PER_SM and combines by the last arriver: "
                             "NUM_SPLITS must be 0, combine 'last_arriver', pdl False")
        for name in ("tma", "pdl", "stream"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be True or False")

    def smem_bytes(self, head_dim: int, dtype: torch.dtype) -> int:
        """Shared memory of the K/V pipeline per program (split_kv_tuning.pipeline_bytes)."""
        return pipeline_bytes(self.BLOCK_N, self.num_stages, head_dim, dtype.itemsize, self.tma)

    def describe(self) -> str:
        grid = f"{self.CTAS_PER_SM}/SM" if self.stream else f"splits{self.NUM_SPLITS or 'auto'}"
        flags = (" tma" if self.tma else "") + (" pdl" if self.pdl else "") + (" stream" if self.stream else "")
        return f"n{self.BLOCK_N} h{self.BLOCK_H} w{self.num_warps} s{self.num_stages} {grid} {self.combine}{flags}"

    def as_dict(self) -> dict:
        return asdict(self)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def split_plan(S: int, splits: int, align: int = SPLIT_ALIGN) -> tuple[int, int]:
    """(chunks, most keys in a chunk): the S keys in groups of `align` (SPLIT_ALIGN, or the tile
    where loads are whole tiles: key_align), chunk c holding groups [c x G / chunks,
    (c + 1) x G / chunks), G = ceil(S / align), so chunks differ by at most one group whatever
    the split count (8192 keys in 33 chunks: 240 or 256 keys), and there are at most G chunks
    (65 keys asked for 6 -> 5 chunks of 16, the last 1)."""
    groups = cdiv(S, align)
    chunks = max(1, min(splits, groups))
    return chunks, cdiv(groups, chunks) * align


def key_align(config: Config, use_tma: bool) -> int:
    """Keys per group, the unit that chunk and stream boundaries fall on. A TMA load fetches a
    whole BLOCK_N tile even where a boundary cuts it (the keys past it are masked out of the
    scores, not out of the load), so with TMA a boundary inside a tile reads that tile twice,
    once by each side: about 3% more HBM bytes at batch 2 / 32k keys, counted with Nsight
    Compute (docs/split_kv.md). Pointer loads skip masked rows, so there the finer SPLIT_ALIGN
    keeps the programs' bytes even."""
    return config.BLOCK_N if use_tma else SPLIT_ALIGN


def default_config(B: int, Hq: int, Hkv: int, Lq: int, S: int, D: int, dtype: torch.dtype, sms: int) -> Config:
    """The knobs of the nearest measured point in split_kv_tuning.TABLE (tile bytes kept for
    other head dims and dtypes, stages cut until two programs fit an SM) with the split count
    that fills that point's programs per SM; 8 warps where a program's rows x D would not fit
    4 warps' registers (64 rows at D 256)."""
    knobs = table_knobs(work_units(B, Hq, Hkv, Lq), S, D, dtype.itemsize, sms)
    if rows_per_program(Hq // Hkv, Lq, 64) * _pow2(D) > 8192:
        knobs["num_warps"] = max(8, knobs["num_warps"])
    return Config(**knobs)


def resolve_splits(config: Config, B: int, Hq: int, Hkv: int, Lq: int, S: int, sms: int) -> int:
    """The split count a launch uses: the config's, or the wave rule's when it says 0."""
    if config.NUM_SPLITS:
        return config.NUM_SPLITS
    units = work_units(B, Hq, Hkv, Lq, config.BLOCK_H)
    return num_splits_for(units, sms * config.CTAS_PER_SM, cdiv(S, config.MIN_CHUNK))


def search_space(B: int, Hq: int, Hkv: int, Lq: int, S: int, D: int, dtype: torch.dtype, sms: int) -> list[Config]:
    """At most 12 candidates: the default first, then its twin in the other schedule (split or
    stream, at about the same programs per SM), its twins with the other combine, with TMA
    loads and with half its splits (split schedule), then the sweep's structures
    (split_kv_tuning: tile keys, stages, warps, TMA) that fit two programs an SM, at 2
    programs an SM. The full sweep is bench/bench_split_kv.py --sweep."""
    default = default_config(B, Hq, Hkv, Lq, S, D, dtype, sms)
    units = work_units(B, Hq, Hkv, Lq)
    knobs = {k: getattr(default, k) for k in ("BLOCK_N", "num_warps", "num_stages", "tma")}
    if default.stream:
        out = [default, Config(**candidate_knobs(units, S, sms, dict(
            knobs, combine="last_arriver", pdl=False, stream=False, programs_per_sm=default.CTAS_PER_SM)))]
    else:
        chunks = split_plan(S, resolve_splits(default, B, Hq, Hkv, Lq, S, sms), key_align(default, default.tma))[0]
        per_sm = max(1, round(units * chunks / sms))
        out = [default, Config(**candidate_knobs(units, S, sms, dict(
            knobs, combine="last_arriver", pdl=False, stream=True, programs_per_sm=min(4, per_sm))))]
        out += [replace(default, combine="kernel" if default.combine == "last_arriver" else "last_arriver")]
        if default.NUM_SPLITS >= 2:
            out.append(replace(default, NUM_SPLITS=default.NUM_SPLITS // 2))
    out.append(replace(default, tma=not default.tma))
    for knobs in structure_candidates(D, dtype.itemsize):
        cfg = Config(**candidate_knobs(units, S, sms, knobs))
        if 2 * cfg.smem_bytes(D, dtype) <= SMEM_PER_BLOCK_SM90 and cfg not in out:
            out.append(cfg)
    return out[:12]


# ---------------------------------------------------------------------------------- Kernels


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, b, kvh, row_block, n_begin, n_end, S, D, LQ, R, GROUP,
            stride_qb, stride_qh, stride_qm, stride_qd,
            stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd,
            qk_scale,
            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
            INT64: tl.constexpr, USE_TMA: tl.constexpr, NUM_STAGES: tl.constexpr):
    """The online softmax of one row block of (batch b, kv-head kvh) over keys [n_begin, n_end):
    (running max m, sum l, unnormalised output acc), all fp32, in base 2."""
    # Query rows of this program: row r is query head kvh x GROUP + r // LQ at position r % LQ.
    rows = row_block * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < R
    g = rows // LQ
    qi = rows % LQ
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_off = (b.to(tl.int64) * stride_qb + (kvh * GROUP + g).to(tl.int64)[:, None] * stride_qh
             + qi[:, None] * stride_qm + offs_d[None, :] * stride_qd)
    if EVEN_D:
        q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    # the last key each row may see (causal: the queries are the last LQ positions)
    last_key = S - LQ + qi

    # Online softmax in base 2. m starts finite so that a row with no visible key in this chunk
    # (an early query of the last chunk) gives exp2(-inf - m) = 0 rather than NaN.
    m_i = tl.full((BLOCK_H,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(n_begin, n_end, BLOCK_N, num_stages=NUM_STAGES):
        n = start + offs_n
        n_ok = n < n_end  # a chunk ends mid-tile: the rest of the tile is the next chunk's
        if USE_TMA:
            # whole tiles (zeros past S); keys of the next chunk are masked out of s below
            k = k_ptr.load([b, kvh, start, 0]).reshape(BLOCK_N, BLOCK_D)
            v = v_ptr.load([b, kvh, start, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            if INT64:
                kv_rows = n.to(tl.int64)
            else:
                kv_rows = n
            k_base = k_ptr + (b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh)
            v_base = v_ptr + (b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh)
            k_off = kv_rows[:, None] * stride_kn + offs_d[None, :] * stride_kd
            v_off = kv_rows[:, None] * stride_vn + offs_d[None, :] * stride_vd
            if EVEN_D:
                k = tl.load(k_base + k_off, mask=n_ok[:, None], other=0.0)
                v = tl.load(v_base + v_off, mask=n_ok[:, None], other=0.0)
            else:
                k = tl.load(k_base + k_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
                v = tl.load(v_base + v_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(n_ok[None, :] & (n[None, :] <= last_key[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _store_rows(o_ptr, acc, l, b, kvh, row0, R, D, LQ, GROUP, stride_ob, stride_oh, stride_om, stride_od,
                ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store acc / l ([ROWS, BLOCK_D] over [ROWS], fp32; a row with l = 0 saw no key and stays
    0) as rows row0.. of (batch b, kv-head kvh) of O."""
    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
    rows = row0 + tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    g = rows // LQ
    qi = rows % LQ
    o_off = (b.to(tl.int64) * stride_ob + (kvh * GROUP + g).to(tl.int64)[:, None] * stride_oh
             + qi[:, None] * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=(rows < R)[:, None] & (offs_d < D)[None, :])


@triton.jit
def _store_partial(opart_ptr, lse_ptr, m_i, l_i, acc, bh, row0, slot, split_stride, R, D,
                   BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """A chunk's partial: its output normalised by its own sum, and its log-sum-exp (base 2;
    -inf for a row that saw no key), at split `slot` of rows row0.. of bh."""
    rows = row0 + tl.arange(0, BLOCK_H)
    row_ok = rows < R
    offs_d = tl.arange(0, BLOCK_D)
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    prow = (bh.to(tl.int64) * R + rows) * split_stride + slot  # (row, split) of the partials
    tl.store(opart_ptr + (prow[:, None] * D + offs_d[None, :]), out, mask=row_ok[:, None] & (offs_d < D)[None, :])
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(lse_ptr + prow, lse, mask=row_ok)


@triton.jit(launch_metadata=attention_launch_metadata("split_kv_attention"))
def split_kv_kernel(
    # pointers: Q (B, Hq, Lq, D), K and V (B, Hkv, S, D) (host tensor descriptors with blocks
    # [1, 1, BLOCK_N, BLOCK_D] when USE_TMA), O (B, Hq, Lq, D);
    # partials: O_part fp32 (B x Hkv x R, num_splits, D), LSE fp32 (B x Hkv x R, num_splits)
    q_ptr, k_ptr, v_ptr, o_ptr, opart_ptr, lse_ptr,
    # "last_arriver": int32 arrival counters, one per (batch x kv-head, row block), zeroed
    counter_ptr,
    # problem size: R = (Hq / Hkv) x Lq query rows per kv-head
    B, H_KV, S, D, LQ, R, GROUP,
    # element strides
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    # the split: chunks over the S / ALIGN key groups (chunk c holds groups
    # [c x GROUPS / num_splits, (c + 1) x GROUPS / num_splits)); softmax scale x log2(e)
    num_splits, key_groups, qk_scale,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,  # D == BLOCK_D: no mask along D (16-byte vector loads)
    DIRECT: tl.constexpr,  # one split: normalise and store O here, no partials
    LAST_ARRIVER: tl.constexpr,  # the last program of a row block combines the splits
    COMBINE_ROWS: tl.constexpr,  # last arriver: rows it combines at once (pow2 of the block's rows)
    COMBINE_SPLITS: tl.constexpr,  # last arriver: splits it loads at once for all those rows
    INT64: tl.constexpr,  # a key's offset within one (batch, head) can pass 2**31
    USE_TMA: tl.constexpr,  # K and V through tensor descriptors (TMA) instead of pointer loads
    PDL: tl.constexpr,  # programmatic dependent launch: let the combine kernel launch early
    ALIGN: tl.constexpr,  # keys per group: chunk boundaries fall on multiples of it
    NUM_STAGES: tl.constexpr,
):
    split = tl.program_id(0)
    row_block = tl.program_id(1)
    bh = tl.program_id(2)  # batch x kv-head
    b = bh // H_KV
    kvh = bh % H_KV
    # equal chunks (+-ALIGN keys) for any split count; int64: split x groups can pass 2**31
    n_begin = ((split.to(tl.int64) * key_groups) // num_splits).to(tl.int32) * ALIGN
    n_end = tl.minimum((((split + 1).to(tl.int64) * key_groups) // num_splits).to(tl.int32) * ALIGN, S)
    m_i, l_i, acc = _attend(q_ptr, k_ptr, v_ptr, b, kvh, row_block, n_begin, n_end, S, D, LQ, R, GROUP,
                            stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                            stride_vb, stride_vh, stride_vn, stride_vd, qk_scale,
                            BLOCK_H, BLOCK_N, BLOCK_D, EVEN_D, INT64, USE_TMA, NUM_STAGES)
    if PDL:
        gdc_launch_dependents()  # the combine kernel may launch now; it waits for our partials

    if DIRECT:
        _store_rows(o_ptr, acc, l_i, b, kvh, row_block * BLOCK_H, R, D, LQ, GROUP,
                    stride_ob, stride_oh, stride_om, stride_od, BLOCK_H, BLOCK_D)
    else:
        _store_partial(opart_ptr, lse_ptr, m_i, l_i, acc, bh, row_block * BLOCK_H, split, num_splits, R, D,
                       BLOCK_H, BLOCK_D)
        if LAST_ARRIVER:
            _arrive(counter_ptr, bh * tl.num_programs(1) + row_block, opart_ptr, lse_ptr, o_ptr, bh, b, kvh,
                    row_block * BLOCK_H, R, D, LQ, GROUP, num_splits, num_splits,
                    stride_ob, stride_oh, stride_om, stride_od, COMBINE_ROWS, COMBINE_SPLITS, BLOCK_D)


@triton.jit(launch_metadata=attention_launch_metadata("stream_kv_attention"))
def stream_kv_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, opart_ptr, lse_ptr,
    counter_ptr,  # int32 arrival counters, one per work unit (batch x kv-head x row block), zeroed
    B, H_KV, S, D, LQ, R, GROUP, ROW_BLOCKS,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    # the work: units x key_groups groups of ALIGN keys laid end to end (unit-major), program p
    # walking groups [p x total / P, (p + 1) x total / P), P = the grid; a unit's partials sit
    # at most max_segments apart
    num_splits, key_groups, total_groups, max_segments, qk_scale,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    COMBINE_ROWS: tl.constexpr, COMBINE_SPLITS: tl.constexpr,
    INT64: tl.constexpr, USE_TMA: tl.constexpr, ALIGN: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """The "stream" schedule (Stream-K for decode; Lean Attention): every program walks the
    same number of key groups (+-1), crossing from one work unit into the next, so that a grid
    of whole SMs finishes together whatever the unit count. The programs that share a unit each
    leave a partial; the last of them to arrive combines them (as split_kv_kernel's last
    arriver). A unit walked by one program alone is stored directly."""
    pid = tl.program_id(0).to(tl.int64)
    P = num_splits  # programs in the grid
    cur = (pid * total_groups) // P
    end = ((pid + 1) * total_groups) // P
    while cur < end:
        u = cur // key_groups  # the work unit: (batch x kv-head) x ROW_BLOCKS + row block
        u0 = u * key_groups
        seg_end = tl.minimum(end, u0 + key_groups)
        # the programs holding the unit's first and last groups: group x lies in the largest p
        # with p x total / P <= x, i.e. p = ((x + 1) x P - 1) // total
        p_first = ((u0 + 1) * P - 1) // total_groups
        p_last = ((u0 + key_groups) * P - 1) // total_groups
        segments = (p_last - p_first + 1).to(tl.int32)
        bh = (u // ROW_BLOCKS).to(tl.int32)
        row_block = (u % ROW_BLOCKS).to(tl.int32)
        b = bh // H_KV
        kvh = bh % H_KV
        n_begin = ((cur - u0) * ALIGN).to(tl.int32)
        n_end = tl.minimum(((seg_end - u0) * ALIGN).to(tl.int32), S)
        m_i, l_i, acc = _attend(q_ptr, k_ptr, v_ptr, b, kvh, row_block, n_begin, n_end, S, D, LQ, R, GROUP,
                                stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                                stride_vb, stride_vh, stride_vn, stride_vd, qk_scale,
                                BLOCK_H, BLOCK_N, BLOCK_D, EVEN_D, INT64, USE_TMA, NUM_STAGES)
        if segments == 1:
            _store_rows(o_ptr, acc, l_i, b, kvh, row_block * BLOCK_H, R, D, LQ, GROUP,
                        stride_ob, stride_oh, stride_om, stride_od, BLOCK_H, BLOCK_D)
        else:
            _store_partial(opart_ptr, lse_ptr, m_i, l_i, acc, bh, row_block * BLOCK_H,
                           (pid - p_first).to(tl.int32), max_segments, R, D, BLOCK_H, BLOCK_D)
            _arrive(counter_ptr, u, opart_ptr, lse_ptr, o_ptr, bh, b, kvh, row_block * BLOCK_H, R, D, LQ, GROUP,
                    segments, max_segments, stride_ob, stride_oh, stride_om, stride_od,
                    COMBINE_ROWS, COMBINE_SPLITS, BLOCK_D)
        cur = seg_end


@triton.jit
def _arrive(counter_ptr, slot, opart_ptr, lse_ptr, o_ptr, bh, b, kvh, row0, R, D, LQ, GROUP, num_splits, split_stride,
            stride_ob, stride_oh, stride_om, stride_od,
            ROWS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The last arriver: after storing its partial, a program bumps the row block's arrival
    counter `slot`; the one that arrives last of num_splits combines them (_combine_rows) and
    resets the counter to zero for the next launch."""
    # Every thread's partial must be in memory before this program announces itself: the
    # barrier orders the block, the acq_rel atomic publishes to (and, for the last arriver,
    # acquires from) the other programs (as kernels/split_k_gemm.py's fixup).
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + slot, 1, sem="acq_rel")
    if arrived == num_splits - 1:
        _combine_rows(opart_ptr, lse_ptr, o_ptr, bh, b, kvh, row0, R, D, LQ, GROUP, num_splits, split_stride,
                      stride_ob, stride_oh, stride_om, stride_od, ROWS, SPLITS, BLOCK_D)
        tl.store(counter_ptr + slot, 0)


@triton.jit
def _combine_rows(opart_ptr, lse_ptr, o_ptr, bh, b, kvh, row0, R, D, LQ, GROUP, num_splits, split_stride,
                  stride_ob, stride_oh, stride_om, stride_od,
                  ROWS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """O for rows row0 .. row0 + ROWS of (batch, kv-head) bh from every split's partial, read
    through L2 (.cg: other SMs wrote them; L1 is not coherent) SPLITS splits at a time for all
    rows at once, so that a 32-split combine is two round trips, not 32 (the first version
    walked the splits one by one: 4 us more than a second kernel at 8k keys; docs/split_kv.md).
    Splits are summed in a fixed order with an online rescale: deterministic."""
    rows = row0 + tl.arange(0, ROWS)
    row_ok = rows < R
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    base = (bh.to(tl.int64) * R + rows) * split_stride  # [ROWS]; splits 0 .. num_splits - 1 follow
    offs_s = tl.arange(0, SPLITS)
    m_c = tl.full((ROWS,), -1.0e30, dtype=tl.float32)
    l_c = tl.zeros((ROWS,), dtype=tl.float32)
    acc_c = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
    for s0 in tl.range(0, num_splits, SPLITS):
        sp = s0 + offs_s
        ok = row_ok[:, None] & (sp < num_splits)[None, :]
        idx = base[:, None] + sp[None, :]  # [ROWS, SPLITS]
        lse_s = tl.load(lse_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        o_s = tl.load(opart_ptr + (idx[:, :, None] * D + offs_d[None, None, :]),
                      mask=ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m_c, tl.max(lse_s, axis=1))
        scale = tl.math.exp2(m_c - m_new)
        w = tl.math.exp2(lse_s - m_new[:, None])
        l_c = l_c * scale + tl.sum(w, axis=1)
        acc_c = acc_c * scale[:, None] + tl.sum(o_s * w[:, :, None], axis=1)
        m_c = m_new
    _store_rows(o_ptr, acc_c, l_c, b, kvh, row0, R, D, LQ, GROUP, stride_ob, stride_oh, stride_om, stride_od, ROWS, BLOCK_D)


@triton.jit
def split_kv_combine_kernel(
    opart_ptr, lse_ptr, o_ptr,
    H_KV, D, LQ, R, GROUP, num_splits,
    stride_ob, stride_oh, stride_om, stride_od,
    BLOCK_S: tl.constexpr,  # >= num_splits: every split's log-sum-exp at once
    CHUNK: tl.constexpr,  # partial outputs loaded at once
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,  # launched early (programmatic dependent launch): wait for the partials
):
    """O[row] = sum_s 2^(lse_s - lse) O_s[row], lse = log2 sum_s 2^lse_s, in split order."""
    if PDL:
        gdc_wait()  # the split kernel's grid has finished and its partials are visible
    row = tl.program_id(0).to(tl.int64)  # over B x Hkv x R
    bh = row // R
    r = row % R
    b = bh // H_KV
    h = (bh % H_KV) * GROUP + r // LQ
    qi = r % LQ
    offs_s = tl.arange(0, BLOCK_S)
    lse = tl.load(lse_ptr + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse, axis=0)  # finite: S >= LQ, so some chunk holds a visible key
    total = tl.sum(tl.math.exp2(lse - m), axis=0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    offs_c = tl.arange(0, CHUNK)
    for s0 in tl.range(0, num_splits, CHUNK):
        s = s0 + offs_c
        s_ok = s < num_splits
        w = tl.math.exp2(tl.load(lse_ptr + row * num_splits + s, mask=s_ok, other=float("-inf")) - m)
        part = tl.load(opart_ptr + ((row * num_splits + s)[:, None] * D + offs_d[None, :]),
                       mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        acc += tl.sum(part * w[:, None], axis=0)
    out = acc / total
    tl.store(o_ptr + (b * stride_ob + h * stride_oh + qi * stride_om + offs_d * stride_od),
             out.to(o_ptr.dtype.element_ty), mask=d_ok)


# ---------------------------------------------------------------------------------- Host launcher


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    """Validate decode attention inputs and return (B, Hq, Hkv, Lq, S, D). Raises
    ValueError/TypeError with one line saying what is wrong."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError("q, k and v must be torch tensors")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, L, D), got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D")
    B, Hq, Lq, D = q.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    Bk, Hkv, S, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head_dim")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    if not 1 <= Lq <= MAX_LQ:
        raise ValueError(f"query length {Lq}: decode attention takes 1..{MAX_LQ} query positions")
    if S < Lq:
        raise ValueError(f"KV length {S} < query length {Lq}: the queries are the last Lq positions of the KV")
    if not MIN_D <= D <= MAX_D:
        raise ValueError(f"head_dim {D}: supported {MIN_D}..{MAX_D}")
    if min(B, Hq) < 1:
        raise ValueError(f"empty problem: q {tuple(q.shape)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype {q.dtype} not supported (fp16, bf16, fp32)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device})")
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("tensors must be on a CUDA device (or set TRITON_INTERPRET=1 for the CPU interpreter)")
    return B, Hq, Hkv, Lq, S, D


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: Config | None = None,
                     scale: float | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal decode attention, O (B, Hq, Lq, D) in q's dtype. q: (B, Hq, Lq, D) with Lq 1..16;
    k, v: (B, Hkv, S, D), Hq a multiple of Hkv, S >= Lq; any strides. Query i sees keys 0 ..
    S - Lq + i. `scale`: 1 / sqrt(D) by default. Returns `out` (any strides) or a new tensor.
    Without a config, kernels/split_kv_gluon.py runs where it can (Triton >= 3.9, sm_90)."""
    B, Hq, Hkv, Lq, S, D = check_attention_inputs(q, k, v)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale {scale!r} must be finite")
    done = _written_pipeline(q, k, v, scale, out) if config is None else None
    if done is not None:
        return done
    sms = num_sms(q.device)
    if config is None:
        config = default_config(B, Hq, Hkv, Lq, S, D, q.dtype, sms)
    group = Hq // Hkv
    R = group * Lq
    block_h = rows_per_program(group, Lq, config.BLOCK_H)
    block_d = _pow2(D)
    out = _prepare_output(out, q)
    rows_total = B * Hkv * R
    int64 = max((S - 1) * abs(t.stride(2)) + (D - 1) * abs(t.stride(3)) for t in (k, v)) >= 2**31 - 1
    use_tma = config.tma and tma_ok(k, v, block_d)
    align = key_align(config, use_tma)
    if use_tma:
        k_arg, v_arg = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, config.BLOCK_N, block_d])
                        for t in (k, v))
    else:
        k_arg, v_arg = k, v
    # the last arriver's [rows, splits, D] fp32 tile: about 64 registers a thread at most (not
    # tied to the split count, so that one compiled kernel serves every split count)
    combine_rows = min(block_h, _pow2(R))
    combine_splits = max(1, _floor_pow2(2048 * config.num_warps // (combine_rows * block_d)))
    common_args = (B, Hkv, S, D, Lq, R, group)
    strides = (*q.stride(), *k.stride(), *v.stride(), *out.stride())

    if config.stream:
        units = work_units(B, Hq, Hkv, Lq, config.BLOCK_H)
        groups = cdiv(S, align)
        total = units * groups
        programs = min(config.CTAS_PER_SM * sms, total)
        max_segments = stream_segments(groups, total, programs)
        opart = torch.empty((rows_total * max_segments * D,), dtype=torch.float32, device=q.device)
        lse = torch.empty((rows_total * max_segments,), dtype=torch.float32, device=q.device)
        counters = SCRATCH.get("split_kv_counters", units, torch.int32, q.device)
        stream_kv_kernel[(programs,)](
            q, k_arg, v_arg, out, opart, lse, counters, *common_args, cdiv(R, block_h), *strides,
            programs, groups, total, max_segments, scale * LOG2E,
            BLOCK_H=block_h, BLOCK_N=config.BLOCK_N, BLOCK_D=block_d, EVEN_D=D == block_d,
            COMBINE_ROWS=combine_rows, COMBINE_SPLITS=combine_splits,
            INT64=int64, USE_TMA=use_tma, ALIGN=align, NUM_STAGES=config.num_stages,
            num_warps=config.num_warps, num_stages=config.num_stages,
        )
        return out

    splits, _ = split_plan(S, resolve_splits(config, B, Hq, Hkv, Lq, S, sms), align)
    direct = splits == 1
    opart = out if direct else torch.empty((rows_total * splits * D,), dtype=torch.float32, device=q.device)
    lse = out if direct else torch.empty((rows_total * splits,), dtype=torch.float32, device=q.device)
    # PDL (the combine kernel only: launching the split kernel early behind whatever kernel came
    # before would need that kernel's cooperation) is an sm_90 launch attribute the CPU
    # interpreter, which replaces the jitted kernels, lacks
    pdl = (config.pdl and not direct and config.combine == "kernel" and gdc_wait is not None
           and isinstance(split_kv_kernel, triton.runtime.JITFunction))
    grid = (splits, cdiv(R, block_h), B * Hkv)
    last = not direct and config.combine == "last_arriver"
    counters = SCRATCH.get("split_kv_counters", grid[1] * grid[2], torch.int32, q.device) if last else out
    split_kv_kernel[grid](
        q, k_arg, v_arg, out, opart, lse, counters, *common_args, *strides,
        splits, cdiv(S, align), scale * LOG2E,
        BLOCK_H=block_h, BLOCK_N=config.BLOCK_N, BLOCK_D=block_d, EVEN_D=D == block_d,
        DIRECT=direct, LAST_ARRIVER=last,
        # 1 x 1 when unused, so that other row counts share the compiled kernel
        COMBINE_ROWS=combine_rows if last else 1, COMBINE_SPLITS=combine_splits if last else 1,
        INT64=int64, USE_TMA=use_tma, PDL=pdl, ALIGN=align, NUM_STAGES=config.num_stages,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if not direct and not last:
        split_kv_combine_kernel[(rows_total,)](
            opart, lse, out,
            Hkv, D, Lq, R, group, splits,
            *out.stride(),
            BLOCK_S=max(16, _pow2(splits)), CHUNK=min(config.COMBINE_CHUNK, max(16, _pow2(splits))),
            BLOCK_D=block_d, PDL=pdl, num_warps=4 if block_d >= 128 else 2, **({"launch_pdl": True} if pdl else {}),
        )
    return out


def stream_segments(groups: int, total: int, programs: int) -> int:
    """Most programs that share one work unit under the stream schedule: each of `programs`
    walks total // programs or one more key groups, so a unit of `groups` groups meets one
    program on its first group and at most ceil((groups - 1) / (total // programs)) more."""
    least = max(1, total // max(1, programs))
    return max(1, min(groups, programs, 1 + cdiv(groups - 1, least)))


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def tma_ok(k: torch.Tensor, v: torch.Tensor, block_d: int) -> bool:
    """K and V can be read through TMA descriptors over (B, Hkv, S, D): D a power of two (the box
    is BLOCK_D wide), contiguous along D, other strides multiples of 16 bytes (a size-1 dim's
    too: the descriptor checks them all) and positive where the dim is longer than 1, bases
    16-byte aligned. Otherwise the launch reads them with pointer loads."""
    if TensorDescriptor is None or k.shape[-1] != block_d:
        return False
    for t in (k, v):
        elt = t.element_size()
        if t.stride(3) != 1 or t.data_ptr() % 16:
            return False
        if any((st * elt) % 16 or (st <= 0 and n > 1) for st, n in zip(t.stride()[:3], t.shape[:3])):
            return False
    return True


def _written_pipeline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, out):
    """O by kernels/split_kv_gluon.py (this schedule, its K/V pipeline written out in Gluon) where it
    runs these inputs (Triton >= 3.9, sm_90, its shapes); else, and in a generated variant, None."""
    try:
        mod = importlib.import_module(f"{__package__}.split_kv_gluon") if __package__ and q.is_cuda else None
    except ImportError:
        mod = None
    return mod.try_decode(q, k, v, scale, _prepare_output(out, q)) if mod else None


def _prepare_output(out: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if not isinstance(out, torch.Tensor):
        raise TypeError("out must be a torch tensor")
    if tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype} on {out.device}, expected q's "
                         f"{tuple(q.shape)} {q.dtype} on {q.device}")
    return out


# ---------------------------------------------------------------------------------- Checking


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """float64 softmax attention on the CPU with this file's causal rule: the truth."""
    q64, k64, v64 = (t.detach().to(torch.float64).cpu() for t in (q, k, v))
    B, Hq, Lq, D = q64.shape
    Hkv, S = k64.shape[1], k64.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k64 = k64.repeat_interleave(Hq // Hkv, dim=1)
    v64 = v64.repeat_interleave(Hq // Hkv, dim=1)
    s = (q64 @ k64.transpose(-1, -2)) * scale
    visible = torch.arange(S)[None, :] <= (S - Lq + torch.arange(Lq))[:, None]
    s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, dim=-1) @ v64


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64; inf when `out` holds NaN/inf."""
    o = out.detach().to(torch.float64).cpu()
    if not torch.isfinite(o).all():
        return math.inf
    ref = ref.detach().to(torch.float64).cpu()  # a reference computed on the GPU is compared here too
    denom = torch.linalg.norm(ref).item()
    return torch.linalg.norm(o - ref).item() / (denom if denom > 0 else 1.0)


def random_inputs(B: int, Hq: int, Hkv: int, Lq: int, S: int, D: int, dtype: torch.dtype, device, seed: int = 0):
    """Fresh normal q, k, v (never zeros) in `dtype` on `device`."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return tuple(torch.randn(shape, generator=g).to(dtype).to(device)
                 for shape in ((B, Hq, Lq, D), (B, Hkv, S, D), (B, Hkv, S, D)))


def self_check(shapes, dtypes=(torch.float16, torch.bfloat16, torch.float32), config: Config | None = None) -> None:
    """Run decode_attention on fresh inputs for each (B, Hq, Hkv, Lq, S, D) and dtype and assert
    the error is under the dtype's tolerance."""
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    fix_interpreter_bf16_dot()  # the interpreter's bf16 tl.dot multiplies bit patterns otherwise
    for shape in shapes:
        for dtype in dtypes:
            q, k, v = random_inputs(*shape, dtype, device)
            out = decode_attention(q, k, v, config)
            err = rel_error(out, reference(q, k, v))
            assert out.shape == q.shape and out.dtype == dtype, (out.shape, out.dtype)
            assert err <= TOLERANCE[dtype], f"{shape} {dtype}: rel err {err:.3e} > {TOLERANCE[dtype]:.0e}"
            print(f"ok  B,Hq,Hkv,Lq,S,D={shape} {dtype!s:<15} rel_err={err:.2e}")


__all__ = ["Config", "decode_attention", "default_config", "search_space", "num_splits_for", "split_plan", "tma_ok",
           "reference", "rel_error", "random_inputs", "TOLERANCE"]


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        self_check([(1, 4, 1, 1, 300, 64), (2, 8, 2, 3, 1000, 32)],
                   config=Config(BLOCK_N=32, num_stages=2, NUM_SPLITS=3, MIN_CHUNK=64))
    else:
        self_check([(1, 32, 8, 1, 8192, 128), (4, 32, 8, 1, 32768, 128), (2, 16, 2, 4, 3000, 64),
                    (1, 8, 8, 1, 1000, 256)])
