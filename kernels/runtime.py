"""Triton's launch path, shortened: fast launches and replayed calls, behind a version gate.

Everything in this folder that reaches into Triton's internals is here, and only here. It was
written against Triton 3.5 and 3.6 (`SUPPORTED_TRITON`); under any other Triton both the fast
path and replays are off, every launch is a plain `kernel[grid](...)`, and the first launch
says so once (a `RuntimeWarning`). Nothing in a schedule changes with the gate: only the
host time of a call.

Why: every `kernel[grid](*args, **kwargs)` call makes Triton bind and specialize each
argument again (one native call per argument, a generated Python binder, the cache key, a
check of the kernel's global variables, the launch-metadata dict and two hook chains). Our
Stream-K kernel has ~70 parameters; that path was about half of an eager
`stream_k_gemm.matmul` call, which made eager calls on the tail shapes host-bound. This path
takes a fifth to a third off the schedules' host time and leaves their GPU time as it was
(docs/host_overhead.md).

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
replaced (tools.sm90_compile_check turns launches into compiles that way), when a launch
hook is attached (a profiler such as proton wants the launch metadata), when a keyword
argument is not a plain, hashable value (a tensor passed by keyword would make every key
new), when a positional argument is of a kind it does not key, or when the grid is a
callable.

ADVISOR_FAST_LAUNCH=0 in the environment (or `LAUNCHES.enabled = False`) turns it off.

Replayed calls (the second half of this file: `call_key`, `replay`, `Recorder`) go one step
further for a schedule's whole `matmul`: its first call with a given key (shapes, strides,
dtypes, alignment, aliasing, config) is recorded as its launches, later ones skip the
schedule's own host work and Triton's Python wrapper. ADVISOR_REPLAY=0 (or
`REPLAYS.enabled = False`) turns that off; ADVISOR_FAST_LAUNCH=0 turns off both. Replays
need Triton's C launcher in 3.5/3.6's argument layout and are not recorded under other
Tritons (`_flat_launcher`).

Caveat: knobs Triton reads per call and folds into its own key (TRITON_DEBUG through
`knobs.runtime.debug`, which is part of this key too, and the instrumentation mode, which is
not) are assumed not to change while a process runs.
"""

from __future__ import annotations

import inspect
import os
import warnings

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

# No GPU (the interpreter, tools.sm90_compile_check's compile-only launches): nothing to
# launch fast. And whoever replaces Triton's launch (that check, a tracer) keeps seeing every
# call: the fast path is taken only while JITFunction.run is the one this module found.
_CUDA = torch.cuda.is_available()
# The Triton releases whose internals this module was written and checked against: the
# launcher objects, CompiledKernel.run, knobs.runtime, the descriptor metadata.
SUPPORTED_TRITON = ((3, 5), (3, 6))


def version_gate(version: str) -> str | None:
    """None when Triton `version` is one this module knows, else the one-line reason it is
    off there. Pure, so a test can ask about any version."""
    try:
        major_minor = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        major_minor = ()
    if major_minor in SUPPORTED_TRITON:
        return None
    known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_TRITON)
    return (f"kernels/runtime.py: Triton {version} is not one of the versions its fast launches and "
            f"replayed calls were written for ({known}); they are off and kernels launch the normal way")


GATE = version_gate(getattr(triton, "__version__", "unknown"))
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
        # ADVISOR_FAST_LAUNCH=0 (or enabled = False) sends every launch through Triton's path;
        # so does a Triton this module was not written for (GATE)
        self.enabled = os.environ.get("ADVISOR_FAST_LAUNCH", "1") != "0" and GATE is None
        self.warned = False  # GATE's message is given once a process

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


def _gated() -> bool:
    """True (after warning once) where the installed Triton is not one this module knows."""
    if GATE is None:
        return False
    if not LAUNCHES.warned:
        LAUNCHES.warned = True
        warnings.warn(GATE, RuntimeWarning, stacklevel=3)
    return True


def launch(kernel, grid: tuple, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, skipping Triton's per-call argument binding once the
    same specialization has been launched before. Returns what Triton's launch returns the
    first time (the compiled kernel), None on the fast path."""
    if (_gated() or not LAUNCHES.enabled or _knobs is None or not _CUDA or callable(grid)
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


def _trailing_values(kernel, compiled, n_args: int, kwargs: dict) -> list | None:
    """The values of the kernel's parameters after the first `n_args` positional ones, in
    parameter order (keywords, defaults where not given); None where no compiled kernel came
    back, a keyword is not a plain value (its key would never repeat), or a parameter has no
    value (Triton would have refused the call; never reached)."""
    if compiled is None or not all(isinstance(v, _PLAIN) for v in kwargs.values()):
        return None
    tail = []
    for param in kernel.params[n_args:]:
        if param.name in kwargs:
            tail.append(kwargs[param.name])
        elif param.has_default:
            tail.append(param.default)
        else:
            return None
    return tail


def _remember(kernel, key: tuple, compiled, n_args: int, kwargs: dict) -> None:
    """Store the compiled kernel and the parameters after the positional ones (keywords in
    parameter order, defaults where not given); refuse kernels called with a keyword that is
    not a plain value, whose keys would never repeat."""
    tail = _trailing_values(kernel, compiled, n_args, kwargs)
    if tail is None:
        LAUNCHES.refused.add(id(kernel))
        return
    if len(LAUNCHES.entries) >= MAX_ENTRIES:
        LAUNCHES.entries.clear()
    LAUNCHES.entries[key] = (compiled, tuple(tail))


# --------------------------------------------------------------------------------------------
# Replayed calls: a whole host call (a matmul) remembered as its launches
# --------------------------------------------------------------------------------------------
#
# The fast path above still leaves a schedule's host function doing all its own work on every
# call (configs, plans, scratch sizes, tensor descriptors, a ~30-entry keyword dict) and Triton
# expanding every descriptor in Python (`inner` in triton/backends/nvidia/driver.py). On
# sm_90 an eager Stream-K call cost ~110 us of host time for ~58 us of GPU work
# (experiments/results/host_overhead/). A replay keeps, per call key
# (shapes, strides, dtypes, alignment, aliasing, config), the launches that call made: the raw
# launcher, the grid, the constant arguments, and where each pointer and each TMA descriptor
# came from among the call's "live" tensors (its inputs, output and scratch). A later call with
# the same key only gathers its live tensors, fills the descriptors for their addresses and
# launches. Everything else the key pins: an argument that is not a constant, a live tensor's
# address or a descriptor over one makes the call unreplayable, and it keeps Triton's path.

try:  # the device-side dtype codes of Triton's descriptor metadata, as its launcher maps them
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as _TMA_DTYPES
except ImportError:  # another backend or Triton version: descriptors are not replayed
    _TMA_DTYPES = None

MAX_REPLAYS = 1024  # remembered calls; a sweep over shapes clears them
_MAX_MAPS = 64  # filled descriptors kept per launch (per base address), see _Step.tensor_map


def _fill_tma_descriptor(*args):
    return triton.runtime.driver.active.utils.fill_tma_descriptor(*args)


# The C launcher's argument layout is Triton's private business and has changed: 3.5 and 3.6
# call it as (grid, stream, function, cooperative, pdl, global scratch, profile scratch,
# *metadata-and-kernel-arguments), which is what `_Step` passes; 3.4 has no profile scratch,
# and 3.7-3.9 pass the metadata, hooks, scratch, argument annotations and the kernel's
# arguments as one tuple. A launcher of the other layouts, called as 3.6's, would fail or
# launch garbage, so replays are recorded only where `CudaLauncher.__call__` still has 3.6's
# signature, (gridX, gridY, gridZ, stream, function, *args), and profile scratch (3.4's has
# none). The fast path above calls `compiled.run` as JITFunction.run itself does, the same
# in 3.4-3.9, so it stays on everywhere.
_FLAT_CALL = ("self", "gridX", "gridY", "gridZ", "stream", "function")
_flat_launchers: dict[type, bool] = {}


def _flat_launcher(run) -> bool:
    """Whether the launcher object `run` (a CompiledKernel's) has 3.6's call signature."""
    cls = type(run)
    known = _flat_launchers.get(cls)
    if known is None:
        try:
            params = list(inspect.signature(cls.__call__).parameters.values())
        except (TypeError, ValueError):  # no Python signature to read (a C launcher object)
            params = []
        known = (tuple(p.name for p in params[:-1]) == _FLAT_CALL
                 and params[-1].kind is inspect.Parameter.VAR_POSITIONAL)
        _flat_launchers[cls] = known
    return known


def _raw_launcher(compiled, has_descriptors: bool):
    """Triton's compiled C launcher behind `compiled.run`, or None where we cannot call it
    directly: a launcher of another Triton's argument layout (see `_flat_launcher`), a kernel
    that needs per-launch scratch memory (CudaLauncher allocates it), or a launcher whose
    descriptor wrapper is not the one we know (it expands descriptors in Python and closes
    over the C function as `launcher`)."""
    run = compiled.run
    if not _flat_launcher(run):
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    raw = getattr(run, "launch", None)
    if not has_descriptors:
        return raw
    code = getattr(raw, "__code__", None)
    if code is None or "launcher" not in code.co_freevars:
        return None
    return raw.__closure__[code.co_freevars.index("launcher")].cell_contents


class _Step:
    """One kernel launch of a replayable call: the C launcher's arguments after the base ones,
    with holes where a live tensor's address or a descriptor over it goes."""

    __slots__ = ("coop", "descriptors", "function", "grid", "maps", "packed", "pdl", "pointers", "raw",
                 "template")

    def __init__(self, raw, grid, compiled, template, pointers, descriptors):
        self.raw = raw
        self.grid = grid
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        self.coop = compiled.run.launch_cooperative_grid
        self.pdl = compiled.run.launch_pdl
        self.template = template
        self.pointers = pointers  # (position, live index)
        self.descriptors = descriptors  # (position, live index, fill_tma_descriptor's other arguments)
        self.maps: dict = {}

    def tensor_map(self, position: int, ptr: int, fill_args: tuple):
        # A descriptor is a pure function of its base address and the pinned rest, and the
        # launcher copies it into the kernel's parameters: weights or rotating buffers that
        # come back find theirs filled already.
        key = (position, ptr)
        m = self.maps.get(key)
        if m is None:
            if len(self.maps) >= _MAX_MAPS:
                self.maps.clear()
            m = self.maps[key] = _fill_tma_descriptor(ptr, *fill_args)
        return m

    def __call__(self, ptrs: list, stream: int) -> None:
        args = self.template.copy()
        for pos, i in self.pointers:
            args[pos] = ptrs[i]
        for pos, i, fill_args in self.descriptors:
            args[pos] = self.tensor_map(pos, ptrs[i], fill_args)
        g = self.grid
        self.raw(g[0], g[1], g[2], stream, self.function, self.coop, self.pdl, None, None, self.packed,
                 None, None, None, *args)


def _build_step(kernel, compiled, grid: tuple, args: tuple, kwargs: dict, live: tuple):
    """The _Step for `kernel[grid](*args, **kwargs)` as launched with these live tensors, or
    None when some argument is none of: a plain constant, a tensor whose address is a live
    tensor's, a host descriptor over a live tensor (its address at the start)."""
    tail = _trailing_values(kernel, compiled, len(args), kwargs)
    if tail is None:
        return None
    values = [*args, *tail]
    has_desc = TensorDescriptor is not None and any(isinstance(v, TensorDescriptor) for v in values)
    if has_desc and _TMA_DTYPES is None:
        return None
    raw = _raw_launcher(compiled, has_desc)
    if raw is None:
        return None
    metas = list(getattr(compiled.metadata, "tensordesc_meta", None) or [])
    ptrs = [t.data_ptr() for t in live]
    template, pointers, descriptors = [], [], []
    n_desc = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.data_ptr() not in ptrs:
                return None
            pointers.append((len(template), ptrs.index(v.data_ptr())))
            template.append(None)
        elif has_desc and isinstance(v, TensorDescriptor):
            if v.base.data_ptr() not in ptrs:
                return None
            i = ptrs.index(v.base.data_ptr())
            shape, strides = [int(s) for s in v.shape], [int(s) for s in v.strides]
            meta = metas[n_desc] if n_desc < len(metas) else None
            n_desc += 1
            if meta is None:  # lowered without a TMA descriptor: base, shape, strides, nan flag, shape, strides
                pointers.append((len(template), i))
                template += [None, *shape, *strides, v.padding == "nan", *shape, *strides]
                continue
            if meta.get("fp4_padded"):
                return None  # not a dtype our schedules use
            fill_args = (meta["swizzle"], meta["elem_size"], _TMA_DTYPES[meta["elem_type"]], meta["block_size"],
                         shape, strides, 1 if v.padding == "nan" else 0)
            descriptors.append((len(template), i, fill_args))
            template += [None, *shape, *strides]
        elif isinstance(v, _PLAIN):
            template.append(v)
        else:
            return None
    if metas and n_desc != len(metas):
        return None
    g = tuple(grid) + (1, 1)
    return _Step(raw, g[:3], compiled, template, tuple(pointers), tuple(descriptors))


class Replay:
    """A remembered call: `gather(*tensors)` gives the live tensors (the call's inputs and
    output, then its scratch), each step launches one kernel."""

    __slots__ = ("device", "gather", "steps")

    def __init__(self, gather, steps: tuple, device: int):
        self.gather = gather
        self.steps = steps
        self.device = device

    def __call__(self, *tensors) -> None:
        ptrs = [t.data_ptr() for t in self.gather(*tensors)]
        stream = _current_stream(self.device)
        for step in self.steps:
            step(ptrs, stream)
        REPLAYS.replayed += 1


class _Replays:
    def __init__(self) -> None:
        self.calls: dict[tuple, Replay] = {}
        self.refused: set = set()  # call keys whose launches could not be replayed
        self.replayed = 0  # calls launched from a replay, for tests and probes
        self.recorded = 0
        # ADVISOR_REPLAY=0 (or enabled = False) leaves every call to the schedule's own path;
        # so does a Triton this module was not written for (GATE)
        self.enabled = os.environ.get("ADVISOR_REPLAY", "1") != "0" and GATE is None

    def clear(self) -> None:
        self.calls.clear()
        self.refused.clear()


REPLAYS = _Replays()


def call_key(tag: str, tensors: tuple, *extra):
    """The replay key of a call on these tensors (inputs and output, CUDA), or None where calls
    are not replayed (no CUDA, replays or the fast path off, Triton's launch replaced or
    hooked). It holds each tensor's dtype, shape, strides and 16-byte alignment (what Triton
    specializes pointers on), which of them share an address, the first tensor's device and
    the current one, Triton's debug knob, ADVISOR_NUM_SMS (the schedules' SM count),
    ADVISOR_TF32_KMAJOR (how fp32 operands are laid out, kernels/tf32_layout.py) and `extra`
    (the config and whatever else the call's launches depend on)."""
    if (_gated() or not REPLAYS.enabled or not LAUNCHES.enabled or _knobs is None or not _CUDA
            or triton.runtime.JITFunction.run is not _TRITON_RUN or _hooks_attached()):
        return None
    ptrs = []
    key = [tag]
    for t in tensors:  # every call pays this loop: plain attribute reads only
        if not t.is_cuda:
            return None
        p = t.data_ptr()
        ptrs.append(p)
        key.append((t.dtype, t.shape, t.stride(), p & 15 == 0))
    # the tensors' device too: a schedule sizes its grid by it, Triton launches on the current one
    key += (tuple(map(ptrs.index, ptrs)), tensors[0].get_device(), _current_device(), _knobs.runtime.debug,
            os.environ.get("ADVISOR_NUM_SMS"), os.environ.get("ADVISOR_TF32_KMAJOR"), *extra)
    return tuple(key)


def replay(key, *tensors) -> bool:
    """Launch the call remembered under `key` for these tensors; False when there is none."""
    if key is None:
        return False
    try:
        r = REPLAYS.calls.get(key)
    except TypeError:  # an unhashable config (not one of ours): the schedule's own path reports it
        return False
    if r is None:
        return False
    r(*tensors)
    return True


class Recorder:
    """Launches a call's kernels (through `launch`) and, with a key, remembers them as a Replay.

        rec = Recorder(key, gather, a, b, c)   # gather(a, b, c) -> live tensors
        rec.launch(kernel, grid, *args, **kwargs)   # as many as the call makes
        rec.commit()

    `gather` must give, for any later call of the same key, the tensors that play the same
    roles (inputs and output first, then scratch obtained the same way). Call `drop()` where
    a call does work outside its launches (staging copies): it is then never replayed."""

    def __init__(self, key, gather, *tensors) -> None:
        try:
            self.key = key if key is not None and key not in REPLAYS.refused else None
        except TypeError:  # unhashable: never recorded
            self.key = None
        self.gather = gather
        self.live = gather(*tensors)
        self.steps: list = []

    def drop(self) -> None:
        self.key = None

    def launch(self, kernel, grid: tuple, *args, **kwargs):
        if self.key is None or callable(grid) or not isinstance(kernel, triton.runtime.JITFunction):
            self.key = None
            return launch(kernel, grid, *args, **kwargs)
        compiled = kernel[grid](*args, **kwargs)
        step = _build_step(kernel, compiled, grid, args, kwargs, self.live)
        if step is None:
            if len(REPLAYS.refused) >= MAX_REPLAYS:
                REPLAYS.refused.clear()
            REPLAYS.refused.add(self.key)
            self.key = None
        else:
            self.steps.append(step)
        return compiled

    def commit(self) -> None:
        if self.key is None or not self.steps:
            return
        if len(REPLAYS.calls) >= MAX_REPLAYS:
            REPLAYS.calls.clear()
        REPLAYS.calls[self.key] = Replay(self.gather, tuple(self.steps), _current_device())
        REPLAYS.recorded += 1
