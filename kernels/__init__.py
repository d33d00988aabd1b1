"""Triton GEMM schedules, one standalone file each (see each file's docstring).

    dp_gemm           data-parallel baseline, grouped tile order
    split_k_gemm      Split-K: atomic or two-phase deterministic reduction
    persistent_gemm   grid = #SMs looping over tiles in grouped order, TMA option
    stream_k_gemm     hybrid data-parallel + Stream-K tail, policy knob (its fixup: stream_k_fixup)
    ws_gemm           Hopper TMA + warp specialization, persistent
    grouped_gemm      many independent small GEMMs in one persistent launch (grouped_tools:
                      the bench baselines and the sm_90 compile check)
    split_kv_attention  decode attention split over the KV sequence (flash-decoding), GQA

Each GEMM schedule's knobs, default config and search space sit beside it in <name>_configs
(dp_configs also holds the Config checks they share). The helpers they share: common (input
checks, tolerances, output), gemm_call (the steps every matmul takes before its launch),
runtime (fast launches and replayed calls, the one module that reaches into Triton internals,
gated on the Triton versions it was written for; runtime_plain is what a generated variant
carries instead), tf32_layout (fp32 operands strided in K: fed through registers by a swap,
or copied K-major where that pays).

advisor imports this folder through `advisor.codegen.kernel_lib`, which works both in a checkout
(`kernels/` at the repository root) and in an installed wheel (`advisor/_data/kernels/`).
Nothing here runs at import time beyond defining kernels.
"""
