"""Triton GEMM schedules, one standalone file each (see each file's docstring).

    dp_gemm           data-parallel baseline, grouped tile order
    split_k_gemm      Split-K: atomic or two-phase deterministic reduction
    persistent_gemm   grid = #SMs looping over tiles in grouped order, TMA option
    stream_k_gemm     hybrid data-parallel + Stream-K tail, policy knob
    ws_gemm           Hopper TMA + warp specialization, persistent
    grouped_gemm      many independent small GEMMs in one persistent launch
    split_kv_attention  decode attention split over the KV sequence (flash-decoding), GQA

and the helpers they share: common (input checks, tolerances), launch (fast launches, replayed
calls), tf32_layout (fp32 operands strided in K: fed through registers by a swap, or copied
K-major where that pays).

advisor imports this folder through `advisor.codegen.kernel_lib`, which works both in a checkout
(`kernels/` at the repository root) and in an installed wheel (`advisor/_data/kernels/`).
Nothing here runs at import time beyond defining kernels.
"""
