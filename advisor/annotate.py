"""Label GEMM regions with their shape, in the convention `advisor diagnose` reads.

    from advisor.annotate import gemm

    with gemm(M, N, K, dtype="bf16"):
        c = a @ b

    @gemm(4096, 4096, 4096, dtype="bf16")
    def step(): ...

The range text is ``advisor.gemm M=<M> N=<N> K=<K> [dtype=<dtype>] [batch=<B>] [<label>]``.
It is written as an NVTX range through the `nvtx` package (or `torch.cuda.nvtx` when only
torch is there) so Nsight Systems records it, and as a `torch.profiler.record_function`
range when a PyTorch profiler is recording, so Kineto traces carry it too. Without any of
them it does nothing. Kernels launched inside the range get the shape in the diagnosis.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, Callable, Iterator

_DTYPES = {"bf16", "fp16", "fp32", "fp8"}
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def range_text(M: int, N: int, K: int, dtype: Any = None, batch: int = 1, label: str | None = None) -> str:
    """The NVTX text for a GEMM; validates every field (it is parsed back later)."""
    dims = {"M": M, "N": N, "K": K, "batch": batch}
    for name, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    parts = [f"advisor.gemm M={M} N={N} K={K}"]
    if dtype is not None:
        d = str(dtype).replace("torch.", "").lower()
        d = _ALIASES.get(d, d)
        if d not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)} (or a torch dtype), got {dtype!r}")
        parts.append(f"dtype={d}")
    if batch != 1:
        parts.append(f"batch={batch}")
    if label:
        # No '=' (it would read as a field), no control characters, bounded length.
        parts.append(re.sub(r"[^A-Za-z0-9_.:/ -]", "_", str(label))[:80])
    return " ".join(parts)


def _nvtx_backend():
    try:
        import nvtx  # type: ignore

        return nvtx.push_range, nvtx.pop_range  # push_range(message) takes the text first
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    except ImportError:
        pass
    return None


@contextlib.contextmanager
def _labelled(text: str) -> Iterator[None]:
    backend = _nvtx_backend()
    record = contextlib.nullcontext()
    try:
        import torch

        if torch._C._autograd._profiler_enabled():  # only while a torch profiler records
            record = torch.autograd.profiler.record_function(text)
    except (ImportError, AttributeError):
        pass
    if backend:
        backend[0](text)
    try:
        with record:
            yield
    finally:
        if backend:
            backend[1]()


class gemm(contextlib.ContextDecorator):
    """Context manager and decorator labelling a GEMM region with its shape."""

    def __init__(self, M: int, N: int, K: int, dtype: Any = None, batch: int = 1, label: str | None = None):
        self.text = range_text(M, N, K, dtype=dtype, batch=batch, label=label)
        self._cm = None

    def __enter__(self):
        self._cm = _labelled(self.text)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        cm, self._cm = self._cm, None
        return cm.__exit__(*exc)


def annotate_matmul(fn: Callable) -> Callable:
    """Wrap `fn(a, b, ...)` so each call is labelled with a@b's shape and dtype."""

    @functools.wraps(fn)
    def wrapper(a, b, *args, **kwargs):
        M, K = a.shape[-2], a.shape[-1]
        N = b.shape[-1]
        with gemm(int(M), int(N), int(K), dtype=getattr(a, "dtype", None)):
            return fn(a, b, *args, **kwargs)

    return wrapper
