"""Split-KV decode attention with its K/V pipeline written out (Gluon, Triton >= 3.9, sm_90).

What
    The same flash-decoding as kernels/split_kv_attention.py (one program walks a chunk of the
    keys of one (batch, kv head) for all its query heads and query positions, writes a partial
    output normalised by its own softmax sum and its base-2 log-sum-exp; a second kernel sums
    the splits in order, or with combine="last_arriver" the last program of a unit does; one
    split writes O directly), with the load pipeline explicit instead of left to Triton's
    pipeliner: a ring of STAGES shared-memory slots, each holding one BLOCK_N-key tile of K and
    of V, filled by TMA with one mbarrier a slot. Before tile j's math the program issues the
    loads of tile j + STAGES - 1 into the slot tile j - 1 used, so STAGES - 1 tiles are always
    in flight while the tensor cores and the softmax work on one. The query rows (Hq / Hkv heads
    x Lq positions, at most 64) are one m64 wgmma tile held in registers; scores and P V are
    synchronous wgmma, so a slot is free once its tile's math returns.
    `decode_attention(q, k, v, scale=None, *, out=None)` runs it; split_kv_attention's
    `decode_attention` calls it for its default config where `supports` says yes.

When it wins
    Wherever the Triton kernel's loads and math take turns within a program: Triton's
    pipeliner gives num_stages=2 one K and one V buffer and issues the next tile's loads only
    once this tile's MMAs have read them, so each program streams below the device's read rate
    and the programs an SM must hide the gaps. Here every program keeps STAGES - 1 tiles in
    flight; the measured comparison with cuDNN and the Triton kernel is docs/split_kv.md's
    "Sixth round".

Caveats
    - Triton >= 3.9 (Gluon) and a CUDA GPU of compute capability 9.x; fp16/bf16; D 64 or 128;
      Hq / Hkv x Lq <= 64; K and V with unit stride along D and 16-byte aligned strides (TMA);
      anything else runs split_kv_attention's Triton kernel (`supports` says why).
    - Split count: one wave of 1 (4 stages) or 2 (3 stages) programs an SM, equal whole-tile
      shares; a split grid that does not divide the SMs leaves some idle (the Triton kernel's
      stream schedule does not).
    - Partials: rows x splits x (D + 1) fp32, allocated per call. More units than SMs (batch x
      kv heads over the SM count) run as several waves of one split each.
    - ADVISOR_SPLIT_KV_GLUON=0 turns the hand-over off; a failed build or launch turns it off
      for the process with one warning (try_decode).

Source of the idea
    Flash-decoding (Dao, Haziza, Massa, Sizov, PyTorch blog, 2023); the TMA + mbarrier ring of
    Hopper GEMMs (CUTLASS's pipelined mainloop), here over K/V tiles; Gluon's API for layouts,
    mbarriers and wgmma. Written here from those facts.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from .common import SCRATCH, num_sms

LOG2E = 1.4426950408889634
MIN_TRITON = (3, 9)
ROWS = 64  # query rows of one program: one m64 wgmma tile (one warpgroup)
HEAD_DIMS = (64, 128)
BLOCK_N = 64
# how the splits are summed: "kernel" (a second kernel, one program an output row) or
# "last_arriver" (the last program of a (batch, kv head) to finish, by an acq_rel arrival
# counter, reads the others' partials back and writes O: one launch). The last arriver measured
# level at short contexts and slower at long ones (docs/split_kv.md, "Seventh round"): the
# second kernel stays the default
COMBINES = ("kernel", "last_arriver")
COMBINE = "kernel"


def combine_tile(R: int) -> tuple[int, int]:
    """(rows, splits) of the last arriver's combine tile for R rows a unit: all rows (a power of
    two) by as many splits as keep it at 64 rows x splits (64 fp32 registers a thread at D 128)."""
    cr = 1 << max(0, (R - 1).bit_length())
    return cr, max(1, ROWS // cr)


def _triton_version() -> tuple[int, int]:
    import triton

    parts = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in triton.__version__.split(".")[:2]]
    return tuple(parts + [0] * (2 - len(parts)))  # type: ignore[return-value]


_WHY = None
try:
    if _triton_version() < MIN_TRITON:
        raise ImportError(f"Triton {'.'.join(map(str, _triton_version()))} < 3.9")
    import triton
    import triton.language as tl
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except Exception as exc:  # noqa: BLE001  (any failure to import Gluon is the reason it does not run)
    _WHY = f"needs Triton >= 3.9 with Gluon: {type(exc).__name__}: {exc}"[:200]


def plan(B: int, Hkv: int, S: int, sms: int) -> tuple[int, int, int]:
    """(splits, tiles a split, stages) for one wave: 2 programs an SM with 3 stages where each
    program still walks >= 16 tiles, else 1 program an SM with 4 (a short chunk spends its
    time filling the ring). Equal whole-tile shares: a ragged second wave cost more than the
    SMs one wave leaves idle (3 splits of 249, 249, 14 tiles at batch 8 / 32k keys)."""
    tiles = math.ceil(S / BLOCK_N)
    units = B * Hkv
    for per_sm, stages in ((2, 3), (1, 4)):
        splits = max(1, min(tiles, per_sm * sms // units))
        per = math.ceil(tiles / splits)
        if per >= 16 or per_sm == 1:
            return math.ceil(tiles / per), per, stages
    raise AssertionError("unreachable")


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """None when this kernel runs these inputs here, else why not (one line)."""
    if _WHY:
        return _WHY
    if os.environ.get("ADVISOR_SPLIT_KV_GLUON") == "0":
        return "turned off by ADVISOR_SPLIT_KV_GLUON=0"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a CUDA GPU of compute capability 9.x (wgmma, TMA)"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"fp16/bf16 only, got {q.dtype}"
    B, Hq, Lq, D = q.shape
    if D not in HEAD_DIMS:
        return f"head_dim {D} not in {HEAD_DIMS}"
    if Hq // k.shape[1] * Lq > ROWS:
        return f"{Hq // k.shape[1]} query heads a kv head x {Lq} positions > {ROWS} rows"
    for t in (k, v):
        if t.stride(3) != 1 or any(s * t.element_size() % 16 for s in t.stride()[:3]) or t.data_ptr() % 16:
            return "K and V need unit stride along D and 16-byte aligned strides (TMA)"
    return None


def _metadata(grid, kernel, args):
    """Triton's launch_metadata hook: the kernel and problem by name, and the bytes it must move
    (K and V once), so a profile of this kernel is diagnosable as advisor's split-KV schedule."""
    k = args["k_desc"].base
    B, Hkv, _, D = k.shape
    S = args["S"]
    return {"name": f"split_kv_kernel_ring [B={B}, Hkv={Hkv}, S={S}, D={D}, splits={args['n_splits']}]",
            "bytes": 2 * B * Hkv * S * D * k.element_size()}


if _WHY is None:

    _ROWS = gl.constexpr(ROWS)

    @gluon.jit
    def _load_q(q_ptr, b, hkv, sqb, sqh, sql, sqd, Lq, G: gl.constexpr, D: gl.constexpr, LAYOUT: gl.constexpr):
        # row r = g * Lq + i: query head hkv * G + g, position i; rows past G * Lq are zeros
        blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        r = gl.expand_dims(gl.arange(0, _ROWS, layout=gl.SliceLayout(1, blocked)), 1)
        c = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, blocked)), 0)
        g = r // Lq
        offs = b.to(gl.int64) * sqb + (hkv * G + g) * sqh + (r - g * Lq) * sql + c * sqd
        q = gl.load(q_ptr + offs, mask=(g < G) & (c < D), other=0.0)
        return gl.convert_layout(q, LAYOUT)

    @gluon.jit
    def _load_tile(k_desc, v_desc, k_bufs, v_bufs, ready, slot, b, hkv, tile, nbytes: gl.constexpr, pred):
        """TMA loads of K/V tile `tile` of (b, hkv) into ring slot `slot`, both on its mbarrier
        (the [1, 1, BN, D] box of the descriptors is the slot's [BN, D])."""
        BN: gl.constexpr = k_desc.block_shape[2]
        D: gl.constexpr = k_desc.block_shape[3]
        mbarrier.expect(ready.index(slot), nbytes, pred=pred)
        tma.async_load(k_desc, [b, hkv, tile * BN, 0], ready.index(slot),
                       k_bufs.index(slot).reshape([1, 1, BN, D]), pred=pred)
        tma.async_load(v_desc, [b, hkv, tile * BN, 0], ready.index(slot),
                       v_bufs.index(slot).reshape([1, 1, BN, D]), pred=pred)

    @gluon.jit
    def _tile(q_dot, k_slot, v_slot, m_i, l_i, acc, t, limit, qk_scale,
              S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr, BN: gl.constexpr):
        """One K/V tile of the online softmax (base 2). Keys past a row's limit (S - Lq + i:
        the causal rule, and the end of the cache, whose tile TMA zero-filled) score -inf."""
        qk = warpgroup_mma(q_dot, k_slot.permute((1, 0)), gl.zeros([_ROWS, BN], gl.float32, S_LAYOUT), use_acc=False)
        keys = t * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, S_LAYOUT))
        qk = gl.where(gl.expand_dims(keys, 0) <= gl.expand_dims(limit, 1), qk * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(qk - gl.expand_dims(m_safe, 1))
        l_i = l_i * alpha + gl.sum(p, axis=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT)), 1)
        p_dot = gl.convert_layout(p.to(v_slot.dtype), gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2))
        acc = warpgroup_mma(p_dot, v_slot, acc)
        return m_new, l_i, acc

    @gluon.jit
    def _store_out(out_ptr, o, b, hkv, R, Lq, sob, soh, sol, sod, G: gl.constexpr, D: gl.constexpr,
                   LAYOUT: gl.constexpr):
        # row r of a (batch, kv head): query head hkv * G + r // Lq, position r % Lq
        r = gl.expand_dims(gl.arange(0, o.shape[0], layout=gl.SliceLayout(1, LAYOUT)), 1)
        c = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, LAYOUT)), 0)
        g = r // Lq
        offs = b.to(gl.int64) * sob + (hkv * G + g) * soh + (r - g * Lq) * sol + c * sod
        gl.store(out_ptr + offs, o.to(out_ptr.dtype.element_ty), mask=(r < R) & (c < D))

    @gluon.jit
    def _combine_unit(po_ptr, plse_ptr, out_ptr, bh, b, hkv, n_splits, R, Lq, sob, soh, sol, sod,
                      G: gl.constexpr, D: gl.constexpr, CR: gl.constexpr, CS: gl.constexpr):
        """The last arriver's combine: O for the R rows of unit bh from every split's partial,
        read through L2 (.cg: other SMs wrote them) as [CR rows, CS splits, D] tiles (64 fp32
        registers a thread), so that a unit's splits are one or two round trips, summed in split
        order with a running maximum (deterministic)."""
        # a warp's lanes 4 fp32 apart along D, the rest along splits then rows; the 4 warps along
        # splits where there are enough, else along rows (no thread holds a replicated copy)
        TD: gl.constexpr = D // 4
        TS: gl.constexpr = min(32 // TD, CS)
        WS: gl.constexpr = min(4, max(1, CS // TS))
        L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [32 // TD // TS, TS, TD], [4 // WS, WS, 1], [2, 1, 0])
        LS: gl.constexpr = gl.SliceLayout(2, L3)  # [CR, CS]
        LO: gl.constexpr = gl.SliceLayout(1, L3)  # [CR, D]
        r2 = gl.expand_dims(gl.arange(0, CR, layout=gl.SliceLayout(1, LS)), 1)
        s2 = gl.expand_dims(gl.arange(0, CS, layout=gl.SliceLayout(0, LS)), 0)
        d3 = gl.expand_dims(gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, LO)), 0), 1)
        base = (bh * R + r2).to(gl.int64) * n_splits  # [CR, 1]
        # -1e30, not -inf: a split that saw no key of a row (lse -inf) then weighs 0, not NaN
        m = gl.full([CR], -1.0e30, gl.float32, gl.SliceLayout(1, LS))
        wsum = gl.zeros([CR], gl.float32, gl.SliceLayout(1, LS))
        acc = gl.zeros([CR, D], gl.float32, LO)
        for s0 in range(0, n_splits, CS):
            idx = base + s0 + s2  # [CR, CS]
            ok = (r2 < R) & (s0 + s2 < n_splits)
            lse = gl.load(plse_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o = gl.load(po_ptr + gl.expand_dims(idx, 2) * D + d3, mask=gl.expand_dims(ok, 2), other=0.0,
                        cache_modifier=".cg")
            m_new = gl.maximum(m, gl.max(lse, axis=1))
            rescale = gl.exp2(m - m_new)
            w = gl.exp2(lse - gl.expand_dims(m_new, 1))
            wsum = wsum * rescale + gl.sum(w, axis=1)
            acc = acc * gl.expand_dims(gl.convert_layout(rescale, gl.SliceLayout(1, LO)), 1) \
                + gl.sum(o * gl.expand_dims(w, 2), axis=1)
            m = m_new
        # padding rows (r >= R) divide 0 by 0; _store_out masks them
        o_fin = acc / gl.expand_dims(gl.convert_layout(wsum, gl.SliceLayout(1, LO)), 1)
        _store_out(out_ptr, o_fin, b, hkv, R, Lq, sob, soh, sol, sod, G, D, LO)

    @gluon.jit(launch_metadata=_metadata)
    def split_kv_kernel_ring(q_ptr, k_desc, v_desc, po_ptr, plse_ptr, out_ptr, counter_ptr, sqb, sqh, sql, sqd,
                             sob, soh, sol, sod, S, Lq, tiles_per_split, n_splits, qk_scale, Hkv,
                             G: gl.constexpr, STAGES: gl.constexpr, S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr,
                             DIRECT: gl.constexpr, LAST: gl.constexpr, CR: gl.constexpr, CS: gl.constexpr):
        BN: gl.constexpr = k_desc.block_shape[2]
        D: gl.constexpr = k_desc.block_shape[3]
        dtype: gl.constexpr = k_desc.dtype
        split = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // Hkv
        hkv = bh - b * Hkv
        t0 = split * tiles_per_split
        n = gl.minimum(gl.cdiv(S, BN) - t0, tiles_per_split)
        # the ring: [STAGES, BN, D] K and V slots (the descriptors' [1, 1, BN, D] boxes)
        slot_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], slot_layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], slot_layout)
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        nbytes: gl.constexpr = 2 * BN * D * dtype.primitive_bitwidth // 8
        for i in gl.static_range(STAGES - 1):
            _load_tile(k_desc, v_desc, k_bufs, v_bufs, ready, i, b, hkv, t0 + i, nbytes, i < n)
        q_dot = _load_q(q_ptr, b, hkv, sqb, sqh, sql, sqd, Lq, G, D,
                        gl.DotOperandLayout(operand_index=0, parent=S_LAYOUT, k_width=2))
        rows = gl.arange(0, _ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
        limit = S - Lq + rows % Lq
        m_i = gl.full([_ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
        l_i = gl.zeros([_ROWS], gl.float32, gl.SliceLayout(1, S_LAYOUT))
        acc = gl.zeros([_ROWS, D], gl.float32, O_LAYOUT)
        for j in range(n):
            # refill the slot tile j - 1 used: its (synchronous) math is done
            nj = j + STAGES - 1
            _load_tile(k_desc, v_desc, k_bufs, v_bufs, ready, nj % STAGES, b, hkv, t0 + nj, nbytes, nj < n)
            s = j % STAGES
            mbarrier.wait(ready.index(s), (j // STAGES) & 1)
            m_i, l_i, acc = _tile(q_dot, k_bufs.index(s), v_bufs.index(s), m_i, l_i, acc, t0 + j, limit, qk_scale,
                                  S_LAYOUT, O_LAYOUT, BN)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
        # partial output normalised by its own sum, and its log-sum-exp (-inf: no key seen)
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))
        o = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
        R = G * Lq
        if DIRECT:  # one split: the partial is the output
            _store_out(out_ptr, o, b, hkv, R, Lq, sob, soh, sol, sod, G, D, O_LAYOUT)
        else:
            r = gl.expand_dims(gl.arange(0, _ROWS, layout=gl.SliceLayout(1, O_LAYOUT)), 1)
            c = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, O_LAYOUT)), 0)
            row = bh * R + r
            gl.store(po_ptr + (row.to(gl.int64) * n_splits + split) * D + c, o, mask=(r < R) & (c < D))
            lse = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(l_i))
            gl.store(plse_ptr + (bh * R + rows) * n_splits + split, lse, mask=rows < R)
            if LAST:
                # every thread's partial is in memory before the program announces itself: the
                # barrier orders the CTA, the acq_rel atomic publishes it to (and, for the last
                # arriver, acquires the others' from) the rest of the grid
                gl.barrier()
                arrived = gl.atomic_add(counter_ptr + bh, 1, sem="acq_rel")
                if arrived == n_splits - 1:
                    _combine_unit(po_ptr, plse_ptr, out_ptr, bh, b, hkv, n_splits, R, Lq, sob, soh, sol, sod,
                                  G, D, CR, CS)
                    gl.store(counter_ptr + bh, 0)  # handed back zeroed for the next call

    @triton.jit
    def split_kv_combine_kernel_ring(po_ptr, plse_ptr, out_ptr, n_splits, Hkv, Lq, sob, soh, sol, sod,
                                     G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
        # one program per output row, the splits summed in order, SPLITS at a time with a
        # running maximum (a long cache at one kv head has hundreds of splits)
        row = tl.program_id(0)
        R = G * Lq
        bh = row // R
        r = row - bh * R
        b = bh // Hkv
        hq = (bh - b * Hkv) * G + r // Lq
        c = tl.arange(0, D)
        m = float("-inf")
        wsum = 0.0
        acc = tl.zeros([D], dtype=tl.float32)
        for s0 in range(0, n_splits, SPLITS):
            sp = s0 + tl.arange(0, SPLITS)
            lse = tl.load(plse_ptr + row * n_splits + sp, mask=sp < n_splits, other=float("-inf"))
            m_new = tl.maximum(m, tl.max(lse, 0))
            rescale = tl.exp2(m - m_new)
            w = tl.exp2(lse - m_new)
            o = tl.load(po_ptr + (row.to(tl.int64) * n_splits + sp[:, None]) * D + c[None, :],
                        mask=sp[:, None] < n_splits, other=0.0)
            acc = acc * rescale + tl.sum(o * w[:, None], 0)
            wsum = wsum * rescale + tl.sum(w, 0)
            m = m_new
        out = acc / wsum
        tl.store(out_ptr + b.to(tl.int64) * sob + hq * soh + (r % Lq) * sol + c * sod, out.to(out_ptr.dtype.element_ty))


_FAILED: list[str] = []


def try_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, out: torch.Tensor):
    """decode_attention where `supports` says it runs and no earlier call failed, else None (the
    caller runs the Triton kernel). Gluon is experimental: a build or launch error in a Triton
    this was not tried on warns once and hands every later call back."""
    if _FAILED or supports(q, k, v) is not None:
        return None
    try:
        return decode_attention(q, k, v, scale, out=out)
    except Exception as exc:  # noqa: BLE001  (any failure: the Triton kernel runs instead)
        _FAILED.append(f"{type(exc).__name__}: {exc}"[:300])
        warnings.warn(f"split_kv_gluon failed ({_FAILED[0]}); decode_attention runs the Triton kernel from now on",
                      RuntimeWarning, stacklevel=3)
        return None


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None, *,
                     out: torch.Tensor | None = None, sms: int | None = None, stages: int | None = None,
                     splits: int | None = None, combine: str = COMBINE) -> torch.Tensor:
    """O (B, Hq, Lq, D) for q (B, Hq, Lq, D), k and v (B, Hkv, S, D), the queries the last Lq
    positions (split_kv_attention's semantics). Inputs split_kv_attention.check_attention_inputs
    accepts and `supports` passes; `out` any strides. `stages` / `splits` / `combine` override
    plan() and the default combine (probes)."""
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    why = supports(q, k, v)
    if why is not None:
        raise RuntimeError(f"split_kv_gluon: {why}")
    B, Hq, Lq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    if sms is None:
        sms = num_sms(q.device)
    n_splits, per, st = plan(B, Hkv, S, sms)
    if splits is not None:
        per = math.ceil(math.ceil(S / BLOCK_N) / splits)
        n_splits = math.ceil(math.ceil(S / BLOCK_N) / per)
    st = stages or st
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    direct = n_splits == 1
    last = not direct and combine == "last_arriver"
    # per call, as the Triton kernel's: a cached pair would be shared by calls on other streams
    # (the caching allocator makes these cheap; under graph capture they come from its pool)
    rows = B * Hkv * G * Lq
    if direct:
        po = plse = out  # unused
    else:
        po = torch.empty((rows, n_splits, D), dtype=torch.float32, device=q.device)
        plse = torch.empty((rows, n_splits), dtype=torch.float32, device=q.device)
    # arrival counters, one a (batch, kv head), zeroed by the pool and handed back zeroed by the
    # last arriver; cached per stream (kernels/common.py)
    counters = SCRATCH.get("split_kv_gluon_counters", B * Hkv, torch.int32, q.device) if last else out
    cr, cs = combine_tile(G * Lq)
    dt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    box = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_N, D], dt)
    k_desc, v_desc = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, BLOCK_N, D], box) for t in (k, v))
    s_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    split_kv_kernel_ring[(n_splits, B * Hkv)](
        q, k_desc, v_desc, po, plse, out, counters, *q.stride(), *out.stride(), S, Lq, per, n_splits,
        scale * LOG2E, Hkv, G, st, s_layout, o_layout, direct, last,
        # 1 x 1 where no program combines, so that those share one compiled kernel
        cr if last else 1, cs if last else 1, num_warps=4)
    if not direct and not last:
        split_kv_combine_kernel_ring[(rows,)](po, plse, out, n_splits, Hkv, Lq, *out.stride(), G, D,
                                              min(64, triton.next_power_of_2(n_splits)), num_warps=4)
    return out
