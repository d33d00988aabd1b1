"""Symptoms: pure functions from a trace to evidence, and one small rule unit per pattern.

Each pattern module defines SYMPTOM (the stable id its rule file names), REQUIRES (frame,
column, question) for "not applicable" notes, `evidence(ctx, rule)` (numbers only; thresholds
come in through the rule) and `judge(evidence, rule, ctx)` (thresholds -> findings).
Adding a pattern: one module here and one `rules/<symptom>.toml`.
"""

from . import (
    attention_bias,
    dtype_churn,
    decode_attention,
    exposed_comm,
    gate,
    hopper_no_ws,
    kv_cache_copies,
    launch_overhead,
    layout_churn,
    memory_bound,
    misaligned_gemm,
    slow_convolution,
    small_grid_long_k,
    tail_wave,
    tensor_cores_unused,
    underfilled_kernel,
    unfused_attention,
)
from .context import Context

# Tier 1-3 levers (layout, dtype, alignment, precision) first, then the Tier-4 schedules.
PATTERNS = (
    layout_churn,
    dtype_churn,
    kv_cache_copies,
    misaligned_gemm,
    tensor_cores_unused,
    unfused_attention,
    attention_bias,
    slow_convolution,
    memory_bound,
    small_grid_long_k,
    tail_wave,
    launch_overhead,
    hopper_no_ws,
    exposed_comm,
    decode_attention,
    underfilled_kernel,
)
GATE = gate

__all__ = ["Context", "PATTERNS", "GATE"]
