"""unfused_attention: attention computed op by op (matmul, softmax, matmul) instead of one fused kernel (Tier 3).

What it detects: on one host thread, a softmax operator over [..., L, S] scores between the
matmul that made them (q [..., L, D] @ k^T [..., D, S]: `matmul`, `bmm`, `baddbmm`) and the
matmul that consumes them ([..., L, S] @ v [..., S, Dv]), not inside a
`scaled_dot_product_attention` call, from Kineto cpu_ops with Input Dims or emit_nvtx ranges
with sizes (attention_chains.py). Every kernel the thread launched from the first matmul's start
to the second's end is the chain's (the scale, mask or bias add, casts and dropout between them
too); in training, the backward chain around its `_softmax_backward_data` likewise.
Why it matters: the scores ([..., L, S]) go to memory and back three to five times, and with
short or odd lengths the GEMMs fall back to kernels for misaligned operands; a fused kernel
(FlashAttention, memory-efficient, cuDNN) keeps the scores on chip. Not everywhere: under ~64
tokens SDPA's kernels measured slower than the op-by-op chain on the H200 (Swin's 49-token
windows: 0.61x), and there the rule says so in a note instead of a finding.
What to do: `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
dropout_p=p, is_causal=...)`; in Hugging Face `transformers`, `attn_implementation="sdpa"`
where the model supports it; in timm, the layer's `fused_attn` (Swin's is off by default);
`nn.MultiheadAttention(need_weights=False)`.
Estimate per shape group, forward and backward apart: the chains' kernel time minus the larger
of (a) the roofline of one fused kernel a chain (both GEMMs' FLOPs at the measured peak for the
dtype, q, k, v and the output moved once at the measured bandwidth, a launch's latency; x 2.5
for the backward) and (b) the chains' time over the speedup SDPA measured over the same
op-by-op attention near the shape (rules/measured/<gpu>.toml [[attention_fusion]], `ratio` and
`ratio_bwd`, from bench/bench_attention_fusion.py). Nothing is claimed where nothing was
measured near the shape or below it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..basics import DTYPE_ALIASES
from ..findings import Finding
from ..rules import Rule
from .attention_chains import chain_kernels, find_chains
from .calibration import attention_fusion_ratio, measured_bandwidth, peak_flops
from .context import ELEMENT_BYTES, Context, as_int, finding_for
from .kernel_kinds import kinds

SYMPTOM = "unfused_attention"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Per (rank, device, BH, L, S, D, Dv, dtype): chains, their kernels' launches and time,
    and the kernel that took the most of it."""
    cols = ["rank", "device_id", "BH", "L", "S", "D", "Dv", "dtype", "kind", "chains", "launches", "total_ns",
            "name", "top_ns", "kernel_names"]
    chains = find_chains(ctx)
    if chains.empty:
        return pd.DataFrame(columns=cols)
    hit = chain_kernels(ctx)
    k = ctx.trace.kernels
    at = np.flatnonzero(hit >= 0)
    if not len(at):
        return pd.DataFrame(columns=cols)
    sub = pd.DataFrame({
        "chain": hit[at].astype(np.int64), "device_id": k["device_id"].to_numpy()[at], "dur_ns": k["dur_ns"].to_numpy(np.int64)[at],
        "name": k["name"].to_numpy(dtype=object)[at],
    })
    c = chains.loc[sub["chain"].to_numpy()].reset_index(drop=True)
    sub = pd.concat([sub, c[["rank", "BH", "L", "S", "D", "Dv", "dtype", "kind"]]], axis=1)
    # no dtype from the ops (emit_nvtx ranges, Kineto without Input type): a chain whose GEMM
    # kernels are full fp32 or TF32 (by name) is an fp32 one; the 16-bit rows are read otherwise
    prec = kinds(ctx)["precision"].astype(object).to_numpy()[at]
    gemm = ctx.kernels["is_gemm"].to_numpy(dtype=bool)[at]
    fp32_chain = pd.Series(gemm & np.isin(prec, ["fp32", "tf32"])).groupby(sub["chain"].to_numpy()).any()
    unknown = sub["dtype"].isna().to_numpy() & sub["chain"].map(fp32_chain).fillna(False).to_numpy(dtype=bool)
    sub.loc[unknown, "dtype"] = "fp32"
    sub["dtype"] = sub["dtype"].fillna("")
    sub["device_id"] = sub["device_id"].fillna(-1)
    out = []
    keys = ["rank", "device_id", "BH", "L", "S", "D", "Dv", "dtype", "kind"]
    for key, g in sub.groupby(keys, sort=False):
        per_name = g.groupby("name", sort=False)["dur_ns"].sum().sort_values(ascending=False, kind="stable")
        out.append({**dict(zip(keys, key)), "chains": int(g["chain"].nunique()), "launches": len(g),
                    "total_ns": int(g["dur_ns"].sum()), "name": str(per_name.index[0]),
                    "top_ns": int(per_name.iloc[0]), "kernel_names": int(len(per_name))})
    return pd.DataFrame(out, columns=cols).sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


def fused_floor_ns(BH: int, L: int, S: int, D: int, Dv: int, dtype: str | None, device: dict | None,
                   latency_ns: float) -> tuple[float, str]:
    """The fastest one fused attention forward over these shapes can run: both GEMMs' FLOPs
    at the dtype's measured peak, q, k, v and the output moved once at the measured bandwidth,
    at least one launch's latency; and the basis in words."""
    dt = dtype or "bf16"
    elt = ELEMENT_BYTES.get(dt, 2)
    flop = 2.0 * BH * L * S * (D + Dv)
    nbytes = float(elt) * BH * (L * D + S * D + S * Dv + L * Dv)
    rate, rate_src = peak_flops(device or {}, "tf32" if dt == "fp32" else dt)
    bw = measured_bandwidth(device or {})
    compute = flop / rate * 1e9 if rate else 0.0
    memory = nbytes / bw * 1e9 if bw else 0.0
    floor = max(compute, memory, latency_ns)
    basis = (f"{flop / 1e9:.2f} GFLOP at {rate / 1e12:.0f} TFLOP/s ({rate_src})" if rate else "no FLOP rate known") + \
        (f", {nbytes / 1e6:.2f} MB at {bw / 1e12:.2f} TB/s" if bw else "")
    return floor, basis


# a fused backward recomputes the scores and makes dQ, dK, dV and dP: 5 GEMMs against the
# forward's 2, and reads q, k, v, o, dO and writes dq, dk, dv: about twice the forward's bytes
_BWD_FLOP, _BWD_BYTES = 2.5, 2.0


def fused_estimate(row: dict, rule: Rule, device: dict | None, dtype: str | None,
                   backward: bool = False) -> tuple[float, str, str, float | None]:
    """(what the group's chains would take fused, confidence, basis, measured speedup or None)
    for one shape group, forward or backward: never under the fused kernel's roofline, never
    more gain than SDPA measured over op-by-op attention near the shape (its backward alone,
    for the backward)."""
    chains = int(row["chains"])
    total = float(row["total_ns"])
    BH, L, S, D, Dv = (int(row[c]) for c in ("BH", "L", "S", "D", "Dv"))
    floor1, floor_basis = fused_floor_ns(BH, L, S, D, Dv, dtype, device, float(rule["latency_floor_ns"]))
    if backward:
        floor1 *= max(_BWD_FLOP, _BWD_BYTES)
    floor = floor1 * chains
    measured = attention_fusion_ratio(device, {"L": L, "S": S, "D": D, "dtype": dtype}, float(rule["near_factor"]),
                                      key="ratio_bwd" if backward else "ratio")
    if measured is None:
        return total, "low", "SDPA was not measured on a shape this small or near it: no gain claimed", None
    ratio, src, how = measured
    where = {"exact": "on this shape", "near": "on the nearest measured shapes (the smallest ratio)",
             "below": "on the largest measured shape with fewer scores (L x S)"}[how]
    confidence = {"exact": "high", "near": "medium", "below": "low"}[how]
    part = "backward" if backward else "forward"
    return max(floor, total / ratio), confidence, (
        f"the {part} chains' kernel time over the {ratio:.2f}x SDPA's {part} measured over the same op-by-op attention "
        f"{where} ({src}); never under one fused kernel's roofline a chain: {floor_basis}"
        + (f" x {max(_BWD_FLOP, _BWD_BYTES):g} for the backward" if backward else "")), ratio


def _note_no_gain(ctx: Context, rank, dev, groups: list[dict], launches: int, chains: int) -> None:
    """Op-by-op attention where fused kernels measured no faster: a result, said once."""
    top = groups[0]
    sp = [g["measured_speedup"] for g in groups if g["measured_speedup"] is not None]
    span = f"{min(sp):.2f}x" if sp and min(sp) == max(sp) else (f"{min(sp):.2f}-{max(sp):.2f}x" if sp else "")
    measured = (f"SDPA measured {span} the op-by-op speed near these shapes" if sp
                else "SDPA was not measured on shapes this small")
    ctx.notes.append(
        f"Attention is computed op by op on rank {rank} (device {dev}): {chains} chains of ~{launches / max(chains, 1):.0f} "
        f"kernels (L={top['query_len']} S={top['key_len']} D={top['head_dim']}, {top['dtype']}); {measured}, so fused "
        "attention saves no GPU time here; where the step waits on the host it still removes most of each chain's "
        "launches (measure the step)")


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    """One finding per (rank, device): one code change (the attention layer) serves every shape
    group and its backward; each group's estimate is bounded on its own, and the group that
    claims the most gives the confidence and the basis."""
    out = []
    if ev.empty:
        return out
    for (rank, dev), grp in ev.groupby(["rank", "device_id"], sort=False):
        rank, dev = as_int(rank), as_int(dev)
        dev = None if dev == -1 else dev
        device = ctx.device_row(rank, dev)
        fwd, bwd = grp[grp["kind"] == "fwd"], grp[grp["kind"] == "bwd"]
        if fwd.empty:
            continue  # a backward without its forward chain in the trace is not known to be attention
        # each backward (BH, L, S) goes to one forward group: the one with the most chains
        owner = {}
        for row in fwd.sort_values("chains", ascending=False, kind="stable").to_dict("records"):
            owner.setdefault((row["BH"], row["L"], row["S"]), (row["D"], row["Dv"], row["dtype"]))
        groups, total, bound, launches, chains, bchains, bwd_ns = [], 0.0, 0.0, 0, 0, 0, 0
        confidence, basis, best = "low", "", -1.0
        for row in fwd.to_dict("records"):
            dtype = DTYPE_ALIASES.get(str(row["dtype"]).lower()) if row["dtype"] else None
            b, conf, why, ratio = fused_estimate(row, rule, device, dtype)
            g_total, g_bound = float(row["total_ns"]), b
            mine = owner.get((row["BH"], row["L"], row["S"])) == (row["D"], row["Dv"], row["dtype"])
            back = bwd[(bwd["BH"] == row["BH"]) & (bwd["L"] == row["L"]) & (bwd["S"] == row["S"])] if mine else bwd.iloc[:0]
            b_ratio = None
            if len(back):
                brow = dict(row, chains=int(back["chains"].sum()), total_ns=int(back["total_ns"].sum()),
                            launches=int(back["launches"].sum()))
                bb, bconf, bwhy, b_ratio = fused_estimate(brow, rule, device, dtype, backward=True)
                bchains += brow["chains"]
                bwd_ns += brow["total_ns"]
                if b_ratio is not None:  # claimed: its kernels and bound join the finding's
                    g_total += brow["total_ns"]
                    g_bound += bb
                    launches += brow["launches"]
                    why = f"{why}; and {bwhy}"
            total += g_total
            bound += g_bound
            launches += int(row["launches"])
            chains += int(row["chains"])
            if g_total - g_bound > best:  # the group that claims the most speaks for the finding
                best, confidence, basis = g_total - g_bound, conf, why
            groups.append({"batch_heads": int(row["BH"]), "query_len": int(row["L"]), "key_len": int(row["S"]),
                           "head_dim": int(row["D"]), "value_dim": int(row["Dv"]), "dtype": dtype or "unknown",
                           "chains": int(row["chains"]), "kernel_ns": int(row["total_ns"]),
                           "backward_chains": int(back["chains"].sum()) if len(back) else 0,
                           "backward_ns": int(back["total_ns"].sum()) if len(back) else 0,
                           "bound_ns": int(g_bound), "confidence": conf, "measured_speedup": ratio,
                           "measured_backward_speedup": b_ratio})
        savings = total - bound
        share = ctx.share(rank, dev, total)
        if share < rule["min_share"]:
            continue
        if savings < rule["min_savings_ns"]:
            if all(g["measured_speedup"] is None or g["measured_speedup"] <= 1.0 for g in groups):
                _note_no_gain(ctx, rank, dev, groups, int(fwd["launches"].sum()), chains)
            continue
        top = fwd.iloc[0]
        dtype = DTYPE_ALIASES.get(str(top["dtype"]).lower()) if top["dtype"] else None
        L, S, D = int(top["L"]), int(top["S"]), int(top["D"])
        claimed_bwd = any(g["measured_backward_speedup"] is not None for g in groups)
        if not bchains:
            scope = "forward chains (no backward in the trace)"
        elif claimed_bwd:
            scope = f"forward and backward ({bchains} backward chains, {bwd_ns / 1e6:.2f} ms)"
        else:
            scope = (f"forward chains only: the {bchains} backward chains ({bwd_ns / 1e6:.2f} ms) gain too, but SDPA's "
                     "backward was not measured near these shapes, so none of it is claimed")
        out.append(finding_for(
            rule, {"rank": rank, "device_id": dev, "launches": launches, "total_ns": int(total)},
            kernel=f"{chains} attention chains of ~{int(fwd['launches'].sum()) / max(chains, 1):.0f} kernels "
                   f"(L={L} S={S} D={D}), most time in {top['name']}",
            rank=rank, device_id=dev, shape={"M": L, "N": S, "K": D, "batch": int(top["BH"]), "dtype": dtype},
            grid=None, block=None, est_savings_ns=int(max(savings, 0)), confidence=confidence,
            evidence={
                "chains": chains,
                "kernels_per_chain": round(int(fwd["launches"].sum()) / max(chains, 1), 1),
                "backward_chains": bchains,
                "backward_ns": bwd_ns,
                "shape_groups": len(groups),
                "groups": groups[:8],
                "top_kernel": str(top["name"]),
                "top_kernel_ns": int(top["top_ns"]),
                "share_of_gpu_time": round(share, 4),
                "bound_ns": int(bound),
                "basis": f"{scope}: {basis}" + (f" (the largest claim of {len(groups)} shape groups, each bounded so)"
                                                if len(groups) > 1 else ""),
            },
            suggestion={"fix": "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, "
                               "dropout_p=p if training else 0.0)"},
            tier=3,
            savings_unit="gpu",
        ))
    return out
