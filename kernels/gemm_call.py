"""The steps every GEMM schedule's `matmul` takes before its own launch, written once.

    call = begin("dp", matmul, a, b, config, out)
    if call.done:               # swapped (C^T = B^T A^T) or replayed: the output is filled
        return call.c
    ...                         # the schedule's config, plan and launches on call.a, call.b, call.c
    rec = Recorder(call.key, ...)

In order: (1) check the operands (`common.check_matmul_inputs`), (2) lay out fp32 operands
strided in K (`tf32_layout.tf32_operands`: registers, or a K-major copy where it pays),
(3) the output (`common.prepare_output`: the caller's `out` checked, or a new tensor),
(4) for schedules that feed A through registers, swap a strided fp32 B into A's place
(`tf32_layout.matmul_swapped`, which calls the schedule's own `matmul` again), (5) the
call's replay key and, for a call like one before, its recorded launches again
(`runtime.call_key`, `runtime.replay`).

A schedule outside this folder (an attention kernel, a Gluon GEMM) can take the steps it
needs one by one: `check_matmul_inputs`, `prepare_output` and `runtime.call_key`/`replay`/
`Recorder` do not depend on each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .common import check_matmul_inputs, num_sms, prepare_output
from .runtime import call_key, replay
from .tf32_layout import matmul_swapped, tf32_operands


@dataclass
class GemmCall:
    """One matmul call after the shared steps: its sizes, its operands as the kernels get
    them, the output, the replay key (None: not replayable), and `done` when the output is
    already filled (swapped or replayed)."""

    M: int
    N: int
    K: int
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    key: tuple | None
    done: bool = False
    config: object = None  # the config to launch: the caller's, or the schedule's default


def begin(tag: str, matmul, a: torch.Tensor, b: torch.Tensor, config, out: torch.Tensor | None, *,
          registers: bool = True, tf32: bool = True, replayable: bool = True, key_extra: tuple = (),
          sizes: tuple[int, int, int] | None = None, default_config=None, check_smem=None,
          **swap_kwargs) -> GemmCall:
    """The shared steps of `matmul(a, b, config, out=out, **swap_kwargs)` (module docstring).
    `registers`: the schedule's kernels feed a strided A through registers, so a strided B is
    swapped into A's place (else both are copied K-major where that pays). `tf32=False`
    leaves fp32 operands as they are. `replayable=False` (a diagnostic call) gives no key.
    `key_extra`: what else the call's launches depend on besides the config. `sizes`: (M, N, K)
    from the caller's own check_matmul_inputs(a, b), which then is not repeated (host time).
    A call that goes on to launch gets `config`, or `default_config(M, N, K, dtype, SMs)` where
    it is None, checked by `check_smem(config, dtype)` (each when given)."""
    M, N, K = sizes if sizes is not None else check_matmul_inputs(a, b)
    if tf32:
        a, b = tf32_operands(a, b, registers=registers)
    c = prepare_output(out, M, N, a)
    if registers and matmul_swapped(matmul, a, b, c, config, **swap_kwargs):
        return GemmCall(M, N, K, a, b, c, None, done=True)
    key = call_key(tag, (a, b, c), config, *key_extra) if replayable else None
    if replay(key, a, b, c):
        return GemmCall(M, N, K, a, b, c, key, done=True)
    if config is None and default_config is not None:
        config = default_config(M, N, K, a.dtype, num_sms(a.device))
    if check_smem is not None:
        check_smem(config, a.dtype)
    return GemmCall(M, N, K, a, b, c, key, config=config)


def inputs_and_output(a, b, c) -> tuple:
    """A call's live tensors where it has no scratch (a replay's gather, kernels/runtime.py)."""
    return a, b, c
