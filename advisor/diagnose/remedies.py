"""The code change to make, for advice that is not a kernel swap.

`advisor.use` can swap a GEMM kernel without touching the program; a CUDA graph, a fusion,
an overlapped collective, a layout, a dtype or a padded dimension are changes to the user's
code. `code_changes(findings)` turns such findings into concrete snippets. Only integers and
advisor's own text go into a snippet (never trace text), so it is printed as-is in a code
block.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

from ..findings import Finding

# Tensor-core GEMMs want K and N in multiples of 64 elements (16-byte rows need 8 for bf16;
# cuBLAS' fast tiles need more): measured on the H200, a GPT-2 LM head 8192x50257x768 took
# 5.1 ms in cuBLAS and 1.0 ms with N padded to 50304 (issue 35).
PAD_TO = 64


@dataclass(frozen=True)
class CodeChange:
    kind: str  # pad_dimension | cuda_graph | grouped | comm_overlap | fusion | channels_last | cast_dtype | fused_attention | static_kv_cache | native_gqa
    why: str  # one line: what it fixes, from which finding
    code: str  # the change, as Python (ints and our own text only)
    finding: str  # symptom of the finding it answers
    est_savings_ns: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pad(n: int) -> int:
    return -(-n // PAD_TO) * PAD_TO


def _pad_change(f: Finding) -> CodeChange | None:
    s = f.shape or {}
    M, N, K = (s.get(k) for k in ("M", "N", "K"))
    if not all(isinstance(v, int) for v in (M, N, K)):
        return None
    return pad_change_for(M, N, K, f.symptom, int(f.est_savings_ns))


def pad_change_for(M: int, N: int, K: int, symptom: str, est_savings_ns: int) -> CodeChange | None:
    """The padding change for a GEMM M x N x K whose N or K is off a multiple of PAD_TO."""
    M, N, K = int(M), int(N), int(K)
    odd = [(name, v) for name, v in (("N", N), ("K", K)) if v % PAD_TO]
    if not odd:
        return None
    name, v = odd[0]
    p = _pad(v)
    if name == "N":
        code = (f"# the output dimension {v} (e.g. a vocabulary) padded to {p}: the extra {p - v} columns are never read\n"
                f"head = torch.nn.Linear(d_model, {p}, bias=False)      # was {v}\n"
                f"logits = head(x)[..., :{v}]\n"
                f"# Hugging Face: model.resize_token_embeddings({v}, pad_to_multiple_of={PAD_TO})")
    else:
        code = (f"# the reduction dimension {v} padded to {p} with zeros (the result is unchanged)\n"
                f"a = torch.nn.functional.pad(a, (0, {p - v}))           # (M, {v}) -> (M, {p})\n"
                f"b = torch.nn.functional.pad(b, (0, 0, 0, {p - v}))     # ({v}, N) -> ({p}, N)")
    return CodeChange("pad_dimension", f"GEMM {M}x{N}x{K}: {name}={v} is not a multiple of {PAD_TO}; "
                      "tensor-core tiles and 16-byte rows run it far below the aligned shape's speed",
                      code, symptom, est_savings_ns)


def _graph_change(f: Finding) -> CodeChange:
    code = ("# capture the launch-bound loop once, replay it each step (static shapes and buffers)\n"
            "g = torch.cuda.CUDAGraph()\n"
            "s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())\n"
            "with torch.cuda.stream(s):\n"
            "    step()                      # warm-up off the capture stream\n"
            "torch.cuda.current_stream().wait_stream(s)\n"
            "with torch.cuda.graph(g):\n"
            "    out = step()\n"
            "g.replay()                      # instead of step(); or torch.compile(step, mode=\"reduce-overhead\")")
    return CodeChange("cuda_graph", f"{f.launches} short kernels with launch gaps between them: the GPU waits on the host",
                      code, f.symptom, int(f.est_savings_ns))


def _grouped_change(f: Finding) -> CodeChange:
    shapes = [str(x) for x in (f.suggestion or {}).get("shapes", []) if all(c.isdigit() or c == "x" for c in str(x))]
    code = ("# many small independent GEMMs in a Python loop: one launch for all of them\n"
            + (f"#   advisor generate grouped --shapes {','.join(shapes[:8])} -o grouped.py\n" if shapes else "")
            + "from grouped import variant_grouped_matmul\n"
            "outs = variant_grouped_matmul(list_of_a, list_of_b)   # was [a @ b for a, b in pairs]\n"
            "# same-shape GEMMs: torch.bmm(torch.stack(list_of_a), torch.stack(list_of_b))")
    return CodeChange("grouped", f"{f.launches} small GEMM launches in a loop", code, f.symptom, int(f.est_savings_ns))


def _comm_change(f: Finding) -> CodeChange:
    s = f.shape or {}
    shape = "x".join(str(s[k]) for k in ("M", "N", "K")) if all(isinstance(s.get(k), int) for k in "MNK") else "MxNxK"
    code = ("# overlap the collective with the GEMM that consumes it (chunked, on two streams)\n"
            f"#   advisor generate comm_overlap --pattern all_gather_matmul --shape {shape} -o overlap.py\n"
            "from overlap import all_gather_matmul\n"
            "y = all_gather_matmul(x_shard, w, group)    # was: dist.all_gather_into_tensor(x, x_shard); y = x @ w\n"
            "# PyTorch >= 2.5: torch.distributed._symmetric_memory.fused_all_gather_matmul")
    return CodeChange("comm_overlap", "communication not hidden behind compute", code, f.symptom, int(f.est_savings_ns))


def _fusion_change(f: Finding) -> CodeChange:
    code = ("# fuse the elementwise chain into its neighbours\n"
            "model = torch.compile(model)    # Inductor fuses pointwise ops and GEMM epilogues")
    return CodeChange("fusion", "chains of memory-bound elementwise kernels", code, f.symptom, int(f.est_savings_ns))


def _channels_last_change(f: Finding) -> CodeChange:
    code = ("# keep activations in the layout cuDNN's convolutions want, end to end\n"
            "model = model.to(memory_format=torch.channels_last)\n"
            "x = x.to(memory_format=torch.channels_last)")
    return CodeChange("channels_last", "layout-conversion kernels around convolutions", code, f.symptom,
                      int(f.est_savings_ns))


def _cast_change(f: Finding) -> CodeChange:
    code = ("# run the GEMMs in bf16 with fp32 accumulation (tensor cores), or allow TF32 for fp32 ones\n"
            "with torch.autocast(\"cuda\", dtype=torch.bfloat16):\n"
            "    out = model(x)\n"
            "torch.backends.cuda.matmul.allow_tf32 = True")
    return CodeChange("cast_dtype", "fp32 GEMMs off the tensor cores", code, f.symptom, int(f.est_savings_ns))


def _attention_change(f: Finding) -> CodeChange:
    code = ("# one fused kernel in place of matmul -> (+ bias) -> softmax -> matmul\n"
            "out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,\n"
            "                                                        dropout_p=p if training else 0.0)\n"
            "# transformers: from_pretrained(..., attn_implementation=\"sdpa\"); timm: layer.fused_attn = True")
    return CodeChange("fused_attention", "attention computed op by op", code, f.symptom, int(f.est_savings_ns))


def _static_cache_change(f: Finding) -> CodeChange:
    code = ("# preallocate the KV cache and write each step's tokens in place (no torch.cat of the whole cache)\n"
            "out = model.generate(input_ids, max_new_tokens=n, cache_implementation=\"static\")   # transformers\n"
            "# a decode loop of your own: one buffer of the longest length, written at the step's position\n"
            "k_cache = torch.empty(B, H_kv, max_len, D, dtype=dtype, device=device)\n"
            "k_cache[:, :, pos:pos + n_new] = k_new   # was: k_cache = torch.cat([k_cache, k_new], dim=2)")
    return CodeChange("static_kv_cache", "the KV cache copied by torch.cat every step", code, f.symptom,
                      int(f.est_savings_ns))


def _native_gqa_change(f: Finding) -> CodeChange:
    code = ("# attention on the grouped K/V (k, v: [B, H_kv, S, D]), not repeated to the query heads\n"
            "out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)   # torch >= 2.5\n"
            "# transformers repeats K/V whenever SDPA gets a mask: register an attention that does not\n"
            "from transformers import AttentionInterface\n"
            "from transformers.masking_utils import AttentionMaskInterface, sdpa_mask\n"
            "def sdpa_grouped(module, q, k, v, mask, dropout=0.0, scaling=None, **kwargs):\n"
            "    if mask is not None:\n"
            "        mask = mask[:, :, :, : k.shape[-2]]\n"
            "    causal = mask is None and q.shape[2] > 1 and getattr(module, \"is_causal\", True)\n"
            "    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling,\n"
            "                                         is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])\n"
            "    return out.transpose(1, 2).contiguous(), None\n"
            "AttentionInterface.register(\"sdpa_grouped\", sdpa_grouped)\n"
            "AttentionMaskInterface.register(\"sdpa_grouped\", sdpa_mask)\n"
            "model.set_attn_implementation(\"sdpa_grouped\")")
    return CodeChange("native_gqa", "K/V repeated to the query heads before attention", code, f.symptom,
                      int(f.est_savings_ns))


_BY_STRATEGY = {"comm_overlap": _comm_change, "fusion": _fusion_change, "channels_last": _channels_last_change,
                "cast_dtype": _cast_change, "cuda_graph": _graph_change, "fused_attention": _attention_change,
                "static_kv_cache": _static_cache_change, "native_gqa": _native_gqa_change}


def code_change(f: Finding) -> CodeChange | None:
    """The code change for one finding, or None when its remedy is a kernel swap only."""
    sched = (f.suggestion or {}).get("schedule")
    if sched == "cuda_graph":
        return _graph_change(f)
    if sched == "grouped":
        return _grouped_change(f)
    if f.strategy in _BY_STRATEGY:
        return _BY_STRATEGY[f.strategy](f)
    if f.strategy == "pad_dimension" or f.shape:
        return _pad_change(f)
    return None


def code_changes(findings: Iterable[Finding]) -> list[CodeChange]:
    """One change per kind and target, in the findings' order (largest savings first)."""
    out, seen = [], set()
    for f in findings:
        c = code_change(f)
        if c is not None and (c.kind, c.code) not in seen:
            seen.add((c.kind, c.code))
            out.append(c)
    return out
