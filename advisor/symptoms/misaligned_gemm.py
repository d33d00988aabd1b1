"""misaligned_gemm: a GEMM slowed by a dimension whose rows are not whole 16-byte units (Tier 2).

What it detects: GEMM kernels whose name carries a CUTLASS alignment under 16 bytes (`_align1`,
`_align2` on 16-bit data: cuBLAS falls back to such kernels, often Turing-era `cutlass_75_...`,
when a leading dimension is not a multiple of 8 elements), or whose known shape has such a
dimension (e.g. a vocabulary of 50257 in bf16: 100514-byte rows) while the launch runs far
under the roofline of the same GEMM padded to aligned sizes. Only a leading dimension (an
operand's row length: K and N for row-major operands, M where A is stored transposed, as a
weight gradient's is; Kineto's Input Strides say which) counts. It names the dimension, the
operands it sizes (M: A and C, N: B and C, K: A and B) and the alignment needed.
Why it matters: without 16-byte rows the fast kernels (vectorized/TMA loads) cannot run; on the
H200 a GPT-2 step's LM-head GEMMs ran at 95-146 TFLOP/s on `cutlass_75_..._align1` and padding
the vocabulary to 50304 took the step from 32.7 to 22.2 ms (issue 32). No schedule fixes it:
Tier-4 rules skip these kernels (kernel_kinds.schedule_excluded).
What to do: pad the dimension to a multiple of 64 and slice the result (for a vocabulary: the
model config's vocab size, or `model.resize_token_embeddings(n, pad_to_multiple_of=64)`); a
padded K needs zeros in both operands and no slice. Where the dimension cannot change, the
fallback is a staged call: copy the operand into a zero-padded buffer before the GEMM (one read
and write of it) and slice the output.
Not this symptom: align1/align2 kernels launched inside a convolution (cuDNN runs an NCHW 1x1
convolution as a GEMM over the spatial size, 14 x 14 = 196 elements, 392-byte rows): their fix is
the layout (channels_last, layout_churn) or the channel count, so they become a note.
Estimate: the launches' time minus the floor of the same GEMM at the padded size (roofline at
the measured peak and bandwidth, at least a launch's latency); without a shape, the measured
ratio `unshaped_speedup` (confidence low).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .context import ELEMENT_BYTES, Context, finding_for, group_launches, launch_rows, shape_of
from .kernel_kinds import _ALIGN, _enabled, align_bytes, device_row, element_bytes_from_name, kinds, row_precision
from .launch_ops import launched_inside
from .attention_chains import chain_kernels
from .roofline import gemm_estimate

SYMPTOM = "misaligned_gemm"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)

_OPERANDS = {"M": "A and C", "N": "B and C", "K": "A and B"}
_TARGET = {"16bit": "bf16", "tf32": "tf32", "fp8": "fp8", "fp32_dtype": "tf32"}


def _elt(row) -> int:
    d = row.get("dtype")
    if isinstance(d, str) and d in ELEMENT_BYTES:
        return ELEMENT_BYTES[d]
    return element_bytes_from_name(str(row["name"])) or 2


def misaligned_dims(shape: dict, elt: int, lead: str | None = None, tagged: bool = False) -> dict[str, int]:
    """The GEMM dimensions that are some operand's row length (leading dimension) and whose
    rows are not a whole number of 16-byte units. `lead`: the leading dimensions the trace's
    strides show (gemm.leading_dims). Without them, a kernel whose name says misaligned may
    owe it to any dimension; for any other, M counts only when A is stored transposed, which
    the strides alone show: an odd M of row-major operands (a decode batch of 4 tokens) is a
    row count, not a row length, and padding it aligns nothing."""
    if isinstance(lead, str):
        dims = [d for d in ("M", "N", "K") if d in lead]
    else:
        dims = ["M", "N", "K"] if tagged else ["N", "K"]
    return {d: int(shape[d]) for d in dims if (int(shape[d]) * elt) % 16}


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = ctx.kernels
    kk = kinds(ctx)
    gemm = k["is_gemm"].to_numpy(dtype=bool) & ~kk["precision"].isin(["fp32", "16bit_simt"]).to_numpy(dtype=bool)
    tagged = kk["misaligned"].to_numpy(dtype=bool)
    shaped = gemm & k["M"].notna().to_numpy(dtype=bool)
    conv = launched_inside(ctx) & tagged & ~shaped
    if conv.any():
        _note_conv(ctx, k, conv)
    # the score and output GEMMs of op-by-op attention: fused attention removes them
    # (unfused_attention), padding a sequence length is not the lever
    attn = (chain_kernels(ctx) >= 0) & (tagged | shaped) if _enabled(ctx, "unfused_attention") else np.zeros(len(k), dtype=bool)
    if (attn & tagged).any():
        _note_attention(ctx, k, attn & tagged)
    out = group_launches(launch_rows(k, ((tagged & ~conv) | shaped) & ~attn, []), [], k, first_cols=("lead",))
    if out.empty:
        return out
    out["align_bytes"] = [align_bytes(str(n)) for n in out["name"]]
    out["elt_bytes"] = [_elt(r) for r in out.to_dict("records")]
    tag_hit = out["align_bytes"].notna() & (out["align_bytes"].fillna(16) < 16)
    lead = out["lead"].astype(object).where(out["lead"].notna(), None) if "lead" in out.columns else [None] * len(out)
    out["odd_dims"] = [misaligned_dims(shape_of(r), r["elt_bytes"], ld, bool(t)) if shape_of(r) else {}
                       for r, ld, t in zip(out.to_dict("records"), lead, tag_hit)]
    keep = tag_hit | out["odd_dims"].map(bool)
    return out[keep.to_numpy()].reset_index(drop=True).assign(tagged=tag_hit[keep.to_numpy()].to_numpy())


def _note_conv(ctx: Context, k: pd.DataFrame, conv) -> None:
    """Say what the misaligned kernels inside convolutions are, once per diagnosis."""
    ns = int(k.loc[conv, "dur_ns"].sum())
    total = int(k["dur_ns"].sum())
    if not total or ns < 0.01 * total:
        return
    ctx.notes.append(
        f"{int(conv.sum()):,} launches ({ns / 1e6:.2f} ms, {100 * ns / total:.1f}% of GPU time) of GEMM kernels for "
        "misaligned operands (_align1/_align2) ran inside convolutions: cuDNN's GEMM over an NCHW tensor's spatial "
        "size (e.g. 14 x 14 = 196) or an odd channel count; the fix is the layout (channels_last) or channel counts "
        "that are multiples of 8, not a GEMM dimension to pad")


def _note_attention(ctx: Context, k: pd.DataFrame, attn) -> None:
    ns = int(k.loc[attn, "dur_ns"].sum())
    ctx.notes.append(
        f"{int(attn.sum()):,} launches ({ns / 1e6:.2f} ms) of GEMM kernels for misaligned operands are the score "
        "and output matmuls of attention computed op by op: fused attention replaces them, not a padded sequence "
        "length (unfused_attention says whether it gains here)")


def _fix(odd: dict[str, int], multiple: int, shape_known: bool = True) -> str:
    if not odd and not shape_known:
        return (f"the shape is unknown (emit_nvtx or Kineto record_shapes give it): pad the dimension that is not a "
                f"multiple of 8 elements to a multiple of {multiple}; if none is, an operand's stride or start is "
                "(a slice or view): make it contiguous or allocate it with 16-byte rows")
    if not odd:
        return ("no dimension is misaligned: an operand's stride or start is (a slice or view); "
                "make it contiguous (x.contiguous()) or allocate it with 16-byte rows")
    parts = []
    for d, v in odd.items():
        padded = math.ceil(v / multiple) * multiple
        if d == "K":
            parts.append(f"pad K {v} -> {padded} with zeros in both operands (the product is unchanged)")
        else:
            parts.append(f"pad {d} {v} -> {padded} (a multiple of {multiple}) and slice the result back to {v}")
    return "; ".join(parts)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ev.empty:
        return out
    multiple = int(rule["pad_multiple"])
    keys = ["rank", "device_id", "name", "M", "N", "K", "batch", "dtype"]
    # one finding per kernel and shape: launches of it on several grids share the remedy
    for _, grp in ev.groupby(keys, sort=False, dropna=False):
        top = grp.iloc[0].to_dict()
        total, launches = int(grp["total_ns"].sum()), int(grp["launches"].sum())
        shape = shape_of(top)
        odd = top["odd_dims"]
        tagged = bool(top["tagged"])
        device = device_row(ctx, top["rank"], -1 if top["device_id"] is None or pd.isna(top["device_id"]) else top["device_id"])
        target = _TARGET.get(row_precision(top) or "16bit", "bf16")
        if shape is not None:
            padded = dict(shape, **{d: math.ceil(v / multiple) * multiple for d, v in odd.items()})
            est = gemm_estimate(total, launches, padded, device, target, int(top["elt_bytes"]), rule["latency_floor_ns"])
            if est is None:
                continue
            per_launch = total / launches
            floor_per_launch = est["floor_ns"] / launches
            roofline_fraction = floor_per_launch / per_launch if per_launch else 1.0
            if not tagged and roofline_fraction > rule["max_roofline_fraction"]:
                continue  # an odd dimension, but the kernel runs near what the padded GEMM would
            savings, floor, basis = est["savings_ns"], est["floor_ns"], "padded to " + f"{padded['M']}x{padded['N']}x{padded['K']}: " + est["basis"]
            confidence = "high" if tagged else "medium"
        else:
            speedup = float(rule["unshaped_speedup"])
            savings = int(total * (1.0 - 1.0 / speedup))
            floor = total - savings
            roofline_fraction = None
            basis = (f"no shape: the launches' time x (1 - 1/{speedup:g}), the measured speed-up of aligned kernels over "
                     "align1 ones (rule unshaped_speedup); give the shape (emit_nvtx, Kineto record_shapes, --shape) to size it")
            confidence = "low"
        share = ctx.share(top["rank"], top["device_id"], total)
        if savings < rule["min_savings_ns"] or share < rule["min_share"]:
            continue
        al = top["align_bytes"]
        tag = _ALIGN.search(str(top["name"]))
        out.append(
            finding_for(
                rule, top,
                shape=shape,
                launches=launches,
                total_ns=total,
                est_savings_ns=int(savings),
                confidence=confidence,
                tier=2,
                evidence={
                    "align_tag": tag.group(0).lstrip("_") if tag else None,
                    "kernel_alignment_bytes": None if al is None or pd.isna(al) else int(al),
                    "alignment_needed_bytes": 16,
                    "element_bytes": int(top["elt_bytes"]),
                    "misaligned_dims": odd,
                    "operands": {d: _OPERANDS[d] for d in odd},
                    "roofline_fraction": None if roofline_fraction is None else round(float(roofline_fraction), 3),
                    "share_of_gpu_time": round(share, 4),
                    "launch_shapes": int(len(grp)),
                    "bound_ns": int(floor),
                    "basis": basis,
                    "covers_kernels": [str(top["name"])],
                },
                suggestion={
                    "fix": _fix(odd, multiple, shape is not None),
                    "pad_multiple": multiple,
                    "fallback": "staged: copy the operand into a zero-padded 16-byte-aligned buffer before the GEMM and slice the output",
                },
            )
        )
    return out
