"""Launch a `@triton.jit` kernel with less host time than `kernel[grid](...)` takes.

Why: every `kernel[grid](*args, **kwargs)` call makes Triton bind and specialize each
argument again (one native call per argument, a generated Python binder, the cache key, a
check of the kernel's global variables, the launch-metadata dict and two hook chains). Our
Stream-K kernel has ~70 parameters; on the H200 (2026-12-01, bench/profile_host.py) that path
was about half of an eager `stream_k_gemm.matmul` call (~100 us), which made eager calls on
the tail shapes host-bound (~58 us of GPU work). With this path, the same process timed the
schedules' host time 19-37% lower than before, and eager do_bench of Stream-K on
1664x1408x8192 fell from 124 to 73 us while its graph-timed GPU time stayed 64-66 us
(bench/results/host_overhead/, H200, 2026-12-01).

How: the first call with a given specialization goes through Triton's normal path, which
compiles (or finds) the kernel and returns it. We remember that compiled kernel under a key
that is at least as fine as Triton's own specialization: each tensor's dtype and 16-byte
alignment (Triton specializes pointers on exactly that), each scalar's type and value,
each host tensor descriptor's dtype, alignment, shape, strides and block, and every keyword
(constexprs and launch options) by value. Later calls with the same key launch the
remembered kernel directly through its launcher (`CompiledKernel.run`, the call Triton makes
itself at the end of `JITFunction.run`), with the arguments in parameter order.

When it steps aside (the plain `kernel[grid](...)` path runs instead): without a CUDA device,
under the CPU interpreter (the kernel is not a JITFunction), when `JITFunction.run` has been
replaced (kernels.sm90_compile_check turns launches into compiles that way), when a launch
hook is attached (a profiler such as proton wants the launch metadata), when a keyword
argument is not a plain, hashable value (a tensor passed by keyword would make every key
new), when a positional argument is of a kind it does not key, or when the grid is a
callable.

ADVISOR_FAST_LAUNCH=0 in the environment (or `LAUNCHES.enabled = False`) turns it off.

Caveat: knobs Triton reads per call and folds into its own key (TRITON_DEBUG through
`knobs.runtime.debug`, which is part of this key too, and the instrumentation mode, which is
not) are assumed not to change while a process runs.
"""

from __future__ import annotations

import os

import torch
import triton

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.4: no host descriptors
    TensorDescriptor = None

try:
    from triton import knobs as _knobs
except ImportError:  # Triton < 3.4: no knobs module, so no fast path
    _knobs = None

# No GPU (the interpreter, kernels.sm90_compile_check's compile-only launches): nothing to
# launch fast. And whoever replaces Triton's launch (that check, a tracer) keeps seeing every
# call: the fast path is taken only while JITFunction.run is the one this module found.
_CUDA = torch.cuda.is_available()
_TRITON_RUN = triton.runtime.JITFunction.run
MAX_ENTRIES = 4096  # remembered (kernel, specialization) pairs; a sweep over shapes clears it
_PLAIN = (int, float, bool, str, type(None), torch.dtype)


class _Launches:
    def __init__(self) -> None:
        self.entries: dict[tuple, tuple] = {}  # key -> (compiled kernel, trailing arguments)
        self.refused: set = set()  # ids of kernels whose calls cannot be keyed (see _remember); kernels
        # are module-level objects that live as long as the process, so their ids stay theirs
        self.fast = 0  # launches that skipped Triton's binding, for tests and probes
        self.slow = 0
        # ADVISOR_FAST_LAUNCH=0 (or enabled = False) sends every launch through Triton's path
        self.enabled = os.environ.get("ADVISOR_FAST_LAUNCH", "1") != "0"

    def clear(self) -> None:
        self.entries.clear()
        self.refused.clear()


LAUNCHES = _Launches()


def _hooks_attached() -> bool:
    rt = _knobs.runtime
    return bool(getattr(rt.launch_enter_hook, "calls", rt.launch_enter_hook)) or bool(
        getattr(rt.launch_exit_hook, "calls", rt.launch_exit_hook))


def _current_device() -> int:
    return torch.cuda.current_device()


def _current_stream(device: int):
    return triton.runtime.driver.active.get_current_stream(device)  # what JITFunction.run launches on


def _arg_key(args: tuple):
    """A hashable key for the positional arguments, or None when one is of a kind we do not
    key (then Triton's own path decides). Plain ints (most arguments: sizes, strides) go in as
    they are; other scalars with their type, so that True, 1 and 1.0 (equal in Python, three
    specializations in Triton) differ. This runs on every launch: types are tested by identity
    first, the cheap test."""
    out = []
    append = out.append
    for x in args:
        t = type(x)
        if t is int:
            append(x)
        elif t is torch.Tensor or isinstance(x, torch.Tensor):
            append((x.dtype, x.data_ptr() % 16 == 0))
        elif t is bool or t is float or t is str or x is None or t is torch.dtype:
            append((t, x))
        elif TensorDescriptor is not None and isinstance(x, TensorDescriptor):
            append((x.base.dtype, x.base.data_ptr() % 16 == 0, tuple(x.shape), tuple(x.strides),
                    tuple(x.block_shape), x.padding))
        else:  # int subclasses (numpy scalars are not ints), anything else
            return None
    return tuple(out)


def launch(kernel, grid: tuple, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, skipping Triton's per-call argument binding once the
    same specialization has been launched before. Returns what Triton's launch returns the
    first time (the compiled kernel), None on the fast path."""
    if (not LAUNCHES.enabled or _knobs is None or not _CUDA or callable(grid)
            or not isinstance(kernel, triton.runtime.JITFunction)
            or triton.runtime.JITFunction.run is not _TRITON_RUN or id(kernel) in LAUNCHES.refused
            or _hooks_attached()):
        LAUNCHES.slow += 1
        return kernel[grid](*args, **kwargs)
    arg_key = _arg_key(args)
    if arg_key is None:
        LAUNCHES.slow += 1
        return kernel[grid](*args, **kwargs)
    device = _current_device()
    key = (id(kernel), device, _knobs.runtime.debug, arg_key, tuple(kwargs.items()))
    try:
        entry = LAUNCHES.entries.get(key)
    except TypeError:  # an unhashable keyword value (a list, say): never keyed for this kernel
        LAUNCHES.refused.add(id(kernel))
        LAUNCHES.slow += 1
        return kernel[grid](*args, **kwargs)
    if entry is None:
        LAUNCHES.slow += 1
        compiled = kernel[grid](*args, **kwargs)
        _remember(kernel, key, compiled, len(args), kwargs)
        return compiled
    compiled, tail = entry
    g = tuple(grid) + (1, 1)
    compiled.run(g[0], g[1], g[2], _current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *tail)
    LAUNCHES.fast += 1
    return None


def _remember(kernel, key: tuple, compiled, n_args: int, kwargs: dict) -> None:
    """Store the compiled kernel and the parameters after the positional ones (keywords in
    parameter order, defaults where not given); refuse kernels called with a keyword that is
    not a plain value, whose keys would never repeat."""
    if compiled is None or not all(isinstance(v, _PLAIN) for v in kwargs.values()):
        LAUNCHES.refused.add(id(kernel))
        return
    tail = []
    for param in kernel.params[n_args:]:
        if param.name in kwargs:
            tail.append(kwargs[param.name])
        elif param.has_default:
            tail.append(param.default)
        else:  # Triton would have refused the call; never reached
            LAUNCHES.refused.add(id(kernel))
            return
    if len(LAUNCHES.entries) >= MAX_ENTRIES:
        LAUNCHES.entries.clear()
    LAUNCHES.entries[key] = (compiled, tuple(tail))
