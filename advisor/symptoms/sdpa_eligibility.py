"""Why SDPA ran its math backend, read from the recorded inputs of the calls that did.

PyTorch's fused GPU backends (flash, memory-efficient, cuDNN) each refuse some inputs; when all
refuse, `aten::_scaled_dot_product_attention_math` runs the attention op by op (in fp32 for
16-bit inputs by default). A Kineto trace recorded with shapes keeps that op's input dims,
strides and dtypes, so the refusals that depend only on those can be named with their fix
instead of "find out why". Only refusals checked on the GPU are named
(bench/probe_sdpa_eligibility.py: H200, torch 2.11, bf16, 2026-12-04; its table is in
bench/results/sdpa_eligibility/):

- a last dimension with a stride other than 1 on q, k, v or the mask: every fused backend
  refuses ("All fused kernels require the last dimension of the input to have stride 1").
  T5 and UMT5 in transformers build the mask from a position bias laid out [1, L, S, H], so the
  merged mask has stride H on its last dim; making the bias contiguous first fixes it.
- a 16-bit head size that is not a multiple of 8 with a mask: memory-efficient and cuDNN refuse
  the head size, flash refuses any mask.
- K and V with fewer heads than q (multi-query: one) and `enable_gqa` off, so that the call
  broadcasts them: the fused backends need equal head counts (Falcon's decode in transformers);
  with enable_gqa=True flash (no mask) or cuDNN (a mask) take the call.

Refusals that leave another fused backend able to run (an fp32 mask: cuDNN takes it; GQA: flash
or cuDNN; head sizes over 256: memory-efficient) are not causes of the math backend, and a call
that none of these explain is counted as unexplained (the general advice applies).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from ..basics import input_dims, input_dtypes, json_list
from .context import Context
from .strings import contains

MATH_OP = "_scaled_dot_product_attention_math"
_OPERANDS = ("q", "k", "v", "mask")

_FIXES = {
    "mask_last_stride": ("make the mask contiguous where it is built: a position bias from an embedding lookup "
                         "permuted to [B, H, L, S] (T5, UMT5) wants .contiguous() before it becomes the mask or is "
                         "merged with a padding mask (the merge then writes a contiguous mask at no extra pass); "
                         "else pass attn_mask=mask.contiguous()"),
    "q_last_stride": "pass q.contiguous() (or lay the projection's output out with head_dim innermost)",
    "k_last_stride": "pass k.contiguous() (or lay the projection's output out with head_dim innermost)",
    "v_last_stride": "pass v.contiguous() (or lay the projection's output out with head_dim innermost)",
    "kv_heads_broadcast": ("pass enable_gqa=True to scaled_dot_product_attention (torch >= 2.5) so that a fused "
                           "backend reads the shared K/V heads as they are"),
    "head_dim_align": ("pad head_dim to a multiple of 8 (zero-pad q, k and v, slice the output; keep the scale of "
                       "the real head size), or drop the mask so that the flash backend can run"),
}


def _enable_gqa(concrete) -> bool | None:
    """The math op's last argument, enable_gqa (q, k, v, mask, dropout, is_causal, dropout_mask,
    scale, enable_gqa), from Kineto's "Concrete Inputs"; None where not recorded."""
    if not concrete or len(concrete) < 9:
        return None
    return {"True": True, "False": False}.get(str(concrete[8]))


def call_causes(dims, strides, dtypes, enable_gqa: bool | None = None) -> list[tuple[str, str]]:
    """(code, why) for each fused-backend refusal these recorded inputs of one math SDPA call
    show (q, k, v, mask in that order; `enable_gqa` None where not recorded), [] when none is
    readable."""
    out = []
    if not dims or len(dims) < 3:
        return out
    strides = strides or []
    for i, name in enumerate(_OPERANDS):
        d = dims[i] if i < len(dims) else None
        s = strides[i] if i < len(strides) else None
        if not (isinstance(d, list) and isinstance(s, list) and d and len(d) == len(s)):
            continue
        # a stride only matters where the dim has more than one element; 0 (a broadcast) is not
        # among the refusals checked on the GPU
        if isinstance(d[-1], int) and d[-1] > 1 and isinstance(s[-1], int) and s[-1] > 1:
            out.append((f"{name}_last_stride",
                        f"the {name}'s last dimension has stride {s[-1]} (shape {d}, strides {s}): every fused GPU "
                        "backend needs stride 1 there"))
    # the head-count and head-size refusals of 4-D calls only (torch refuses other ranks for
    # every fused backend, a cause not named here)
    q = dims[0] if isinstance(dims[0], list) and len(dims[0]) == 4 else None
    k = dims[1] if isinstance(dims[1], list) and len(dims[1]) == 4 else None
    if (enable_gqa is False and q and k and isinstance(q[1], int) and isinstance(k[1], int) and k[1] < q[1]):
        out.append(("kv_heads_broadcast", f"k and v have {k[1]} head{'s' if k[1] > 1 else ''} against q's {q[1]} "
                                          "with enable_gqa off, broadcast by the call: the fused backends need "
                                          "equal head counts"))
    has_mask = len(dims) > 3 and isinstance(dims[3], list) and len(dims[3]) > 0
    dt = (list(dtypes) + [None])[0] if dtypes else None
    if q and isinstance(q[-1], int) and q[-1] % 8 and has_mask and dt in ("bf16", "fp16"):
        out.append(("head_dim_align", f"head_dim {q[-1]} is not a multiple of 8 (the memory-efficient and cuDNN "
                                      "backends refuse it) and a mask is passed (the flash backend refuses any)"))
    return out


def _math_ranges(ctx: Context) -> tuple[pd.DataFrame, np.ndarray]:
    """The math-SDPA forward calls of every rank (innermost_ranges' frame, with their recorded
    arguments where the trace has them) and each kernel's call (its row there, or -1); computed
    once a trace (math_sdpa_kernels and math_sdpa_calls both read it)."""
    if "math_sdpa_ranges" in ctx.cache:
        return ctx.cache["math_sdpa_ranges"]
    from .gemm import innermost_ranges

    out = (pd.DataFrame(), np.full(len(ctx.kernels), -1, dtype=np.int64))
    ops = ctx.trace.cpu_ops
    if len(ops):
        sel = contains(ops["name"], MATH_OP).to_numpy() & ~contains(ops["name"], "backward").to_numpy()
        if sel.any():
            cols = ["rank", "thread_id", "start_ns", "end_ns"] + [
                c for c in ("input_dims", "input_types", "input_strides", "concrete_inputs") if c in ops.columns]
            out = innermost_ranges(ctx.trace, ops.loc[sel, cols])
    ctx.cache["math_sdpa_ranges"] = out
    return out


def math_sdpa_kernels(ctx: Context) -> np.ndarray:
    """Per kernel: launched inside a math-SDPA forward call (Kineto cpu_ops). dtype_churn's
    sdpa_backend replaces the whole path, so no other rule prescribes for these kernels
    (kernel_kinds.schedule_excluded)."""
    return _math_ranges(ctx)[1] >= 0


def math_sdpa_calls(ctx: Context, rank, dev) -> list[dict]:
    """The rank's math-SDPA forward calls whose kernels ran on this device (every call of the rank
    where the trace links no kernel to a launch call), each with its recorded dims and dtypes,
    the refusals they show (`call_causes`) and the device's kernels inside it (every kernel the
    backend ran: GEMMs, casts, softmax, the mask's add, K/V expands): [{"dims", "dtype",
    "causes", "ns", "launches", "names"}]."""
    ranges, hit = _math_ranges(ctx)
    if not len(ranges) or "input_dims" not in ranges.columns:
        return []
    k = ctx.kernels
    on = ((k["rank"] == rank).to_numpy() & (k["device_id"].fillna(-1).astype("int64") == dev).to_numpy()
          & (hit >= 0))
    linked = bool(on.any())
    dur = (k["end_ns"] - k["start_ns"]).to_numpy()
    per_call = np.bincount(hit[on], weights=dur[on], minlength=len(ranges))
    launches = np.bincount(hit[on], minlength=len(ranges))
    names_by_call: dict[int, set] = {}
    for i, name in zip(hit[on], k["name"].to_numpy()[on]):
        names_by_call.setdefault(int(i), set()).add(str(name))
    out = []
    none = [None] * len(ranges)
    mine = (ranges["rank"] == rank).to_numpy()
    for i, (d_text, t_text, s_text, c_text) in enumerate(zip(
            ranges["input_dims"], *(ranges[c] if c in ranges.columns else none
                                    for c in ("input_types", "input_strides", "concrete_inputs")))):
        if not mine[i]:
            continue  # another rank's call (kernels match calls of their own rank only)
        if linked and not launches[i]:
            continue  # another device's call (or one whose kernels the trace does not link)
        dims = input_dims(d_text)
        if not dims:
            continue
        dtypes = input_dtypes(t_text)
        out.append({"dims": dims, "dtype": (dtypes + [None])[0],
                    "causes": call_causes(dims, json_list(s_text), dtypes, _enable_gqa(json_list(c_text))),
                    "ns": float(per_call[i]), "launches": int(launches[i]), "names": names_by_call.get(i, set())})
    return out


def math_sdpa_groups(calls: list[dict]) -> list[dict]:
    """Calls (math_sdpa_calls) grouped by attention shape: [{"BH", "L", "S", "D", "Dv", "dtype",
    "calls" (= "chains", the name unfused_attention.fused_estimate reads), "total_ns", "launches",
    "names"}], the most kernel time first; calls without 4-D q, k, v are left out."""
    groups: dict[tuple, dict] = {}
    for c in calls:
        q, kk, v = (c["dims"] + [None] * 3)[:3]
        if not all(isinstance(x, list) and len(x) == 4 and all(isinstance(n, int) for n in x) for x in (q, kk, v)):
            continue
        key = (q[0] * q[1], q[2], kk[2], q[3], v[3], c["dtype"])
        g = groups.setdefault(key, dict(zip(("BH", "L", "S", "D", "Dv", "dtype"), key), calls=0, chains=0,
                                        total_ns=0.0, launches=0, names=set()))
        g["calls"] += 1
        g["chains"] += 1
        g["total_ns"] += c["ns"]
        g["launches"] += c["launches"]
        g["names"] |= c["names"]
    return sorted((g for g in groups.values() if g["total_ns"] > 0), key=lambda g: -g["total_ns"])


def math_sdpa_causes(calls: list[dict]) -> dict:
    """What refused the fused backends over these calls (math_sdpa_calls): {"calls",
    "unexplained", "causes": [{"code", "calls", "why", "fix"}]} (causes most calls first, `why`
    from the first call that shows it); {} without calls."""
    if not calls:
        return {}
    counts: dict[str, int] = {}
    why: dict[str, str] = {}
    for c in calls:
        for code, text in c["causes"]:
            counts[code] = counts.get(code, 0) + 1
            why.setdefault(code, text)
    causes = [{"code": c, "calls": n, "why": why[c], "fix": _FIXES[c]}
              for c, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return {"calls": len(calls), "unexplained": sum(not c["causes"] for c in calls), "causes": causes}
