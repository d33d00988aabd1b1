"""kernels/runtime.py's replayed calls, on the CPU with stand-ins for Triton's compiled kernel and
its C launcher (the real ones need a GPU; experiments/check_replay.py runs every schedule through
replays on one and checks the results)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import runtime as launch_mod
from kernels.runtime import LAUNCHES, REPLAYS, Recorder, call_key, replay


def _body(x_ptr, y_desc, n, flag, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 7):
    pass


def _plain(x_ptr, n, BLOCK: tl.constexpr):
    pass


def _wrapped(launcher):
    """Shaped like Triton's descriptor wrapper: a closure over the C launcher as `launcher`."""
    def inner(*args):
        return launcher(*args)

    return inner


class FakeLauncher(SimpleNamespace):
    """CompiledKernel.run, with Triton 3.6's signature: kernels.runtime.launch's fast path calls it."""

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.calls.append((gridX, gridY, gridZ, stream, function, *args))


class FakeLauncher37(FakeLauncher):
    """Triton 3.7-3.9's CompiledKernel.run: the metadata and hooks named, and a C launcher that
    takes the kernel's arguments as one tuple after the scratch and argument annotations."""

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):
        self.calls.append((gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                           launch_enter_hook, launch_exit_hook, *args))


class FakeCompiled:
    function = "fn-handle"
    packed_metadata = ("meta",)

    def __init__(self, c_launch, descriptors: bool, metas=None, scratch: int = 0, known_wrapper: bool = True,
                 launcher=FakeLauncher):
        wrapper = _wrapped if known_wrapper else (lambda f: lambda *args: f(*args))  # no `launcher` cell
        self.run = launcher(
            launch=wrapper(c_launch) if descriptors else c_launch,
            global_scratch_size=scratch, profile_scratch_size=0,
            launch_cooperative_grid=False, launch_pdl=True, calls=[])
        self.metadata = SimpleNamespace(tensordesc_meta=metas)


META = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [16, 32], "fp4_padded": False}


@pytest.fixture
def env(monkeypatch):
    """JITFunctions whose compile-and-launch is a recorder, a recording C launcher and
    descriptor filler, and the GPU-only queries answered."""
    REPLAYS.clear()
    LAUNCHES.clear()
    log = SimpleNamespace(triton=[], raw=[], fills=[])

    def c_launch(*args):
        log.raw.append(args)

    def fill(ptr, *rest):
        log.fills.append((ptr, rest))
        return ("map", ptr)

    def jit(fn, descriptors, metas=None, scratch=0, known_wrapper=True, launcher=FakeLauncher):
        k = triton.runtime.JITFunction(fn)

        def fake_run(*args, grid, warmup, **kwargs):
            log.triton.append((k, grid, args, kwargs))
            return FakeCompiled(c_launch, descriptors, metas, scratch, known_wrapper, launcher)

        k.run = fake_run
        return k

    monkeypatch.setattr(launch_mod, "_CUDA", True)
    monkeypatch.setattr(launch_mod, "_current_device", lambda: 0)
    monkeypatch.setattr(launch_mod, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(launch_mod, "_fill_tma_descriptor", fill)
    log.jit = jit
    yield log
    REPLAYS.clear()
    LAUNCHES.clear()


def _gather(x, y):
    return x, y


def _record(kernel, key, x, y, **kwargs):
    rec = Recorder(key, _gather, x, y)
    desc = TensorDescriptor(y, [8, 64], [64, 1], [16, 32])
    rec.launch(kernel, (3,), x, desc, 10, True, BLOCK=32, num_warps=4, **kwargs)
    rec.commit()
    return rec


def test_a_replay_fills_new_addresses_and_descriptors_into_the_recorded_launch(env):
    k = env.jit(_body, descriptors=True, metas=[META])
    x, y = torch.randn(64), torch.randn(8, 64)
    _record(k, ("k",), x, y)
    assert len(env.triton) == 1 and not env.raw  # recorded through Triton's own path
    x2, y2 = torch.randn(64), torch.randn(8, 64)
    assert replay(("k",), x2, y2)
    assert len(env.triton) == 1 and REPLAYS.replayed == 1
    (args,) = env.raw
    # grid (3-D), stream, function, cooperative, PDL, no scratch, metadata, no launch
    # metadata or hooks; then x's address, y's descriptor (its map, shape, strides), the
    # scalars, and the constexprs in parameter order with the unpassed default
    assert args[:13] == (3, 1, 1, 1234, "fn-handle", False, True, None, None, ("meta",), None, None, None)
    assert args[13:] == (x2.data_ptr(), ("map", y2.data_ptr()), 8, 64, 64, 1, 10, True, 32, 7)
    # the descriptor's other fields as Triton's launcher passes them (host dtype code 8 for 9)
    assert env.fills == [(y2.data_ptr(), (3, 2, 8, [16, 32], [8, 64], [64, 1], 0))]


def test_a_descriptor_is_filled_once_per_base_address(env):
    k = env.jit(_body, descriptors=True, metas=[META])
    x, y = torch.randn(64), torch.randn(8, 64)
    _record(k, ("k",), x, y)
    other = torch.randn(8, 64)
    for y_now in (y, other, y, other):
        replay(("k",), x, y_now)
    assert [f[0] for f in env.fills] == [y.data_ptr(), other.data_ptr()]
    assert [a[14] for a in env.raw] == [("map", p) for p in (y.data_ptr(), other.data_ptr()) * 2]


def test_a_descriptor_lowered_without_tma_passes_base_shape_strides_as_triton_does(env):
    k = env.jit(_body, descriptors=True, metas=None)
    x, y = torch.randn(64), torch.randn(8, 64)
    _record(k, ("k",), x, y)
    replay(("k",), x, y)
    assert env.raw[0][13:25] == (x.data_ptr(), y.data_ptr(), 8, 64, 64, 1, False, 8, 64, 64, 1, 10)
    assert not env.fills


def test_several_launches_replay_in_order(env):
    k1, k2 = env.jit(_plain, descriptors=False), env.jit(_plain, descriptors=False)
    x, y = torch.randn(64), torch.randn(64)
    rec = Recorder(("two",), _gather, x, y)
    rec.launch(k1, (4,), x, 5, BLOCK=8)
    rec.launch(k2, (2, 3), y, 6, BLOCK=16)
    rec.commit()
    x2, y2 = torch.randn(64), torch.randn(64)
    replay(("two",), x2, y2)
    assert [a[:3] for a in env.raw] == [(4, 1, 1), (2, 3, 1)]
    assert [a[13:] for a in env.raw] == [(x2.data_ptr(), 5, 8), (y2.data_ptr(), 6, 16)]


@pytest.mark.parametrize("why", ["foreign_tensor", "offset_view", "scratch", "unknown_wrapper", "tensor_keyword"])
def test_launches_that_cannot_be_replayed_leave_the_call_to_its_own_path(env, why):
    x, y = torch.randn(64), torch.randn(8, 64)
    k = env.jit(_body, descriptors=True, metas=[META], scratch=16 if why == "scratch" else 0,
                known_wrapper=why != "unknown_wrapper")
    rec = Recorder(("k",), _gather, x, y)
    desc = TensorDescriptor(y, [8, 64], [64, 1], [16, 32])
    first = {"foreign_tensor": torch.randn(64), "offset_view": x[4:]}.get(why, x)
    kwargs = {"EXTRA": torch.zeros(1)} if why == "tensor_keyword" else {}
    rec.launch(k, (3,), first, desc, 10, True, BLOCK=32, **kwargs)
    rec.commit()
    assert len(env.triton) == 1  # it did launch
    assert not replay(("k",), x, y) and ("k",) in REPLAYS.refused and not REPLAYS.calls
    # and the key is not recorded again: the next call goes straight to `launch`
    assert Recorder(("k",), _gather, x, y).key is None


@pytest.mark.parametrize("descriptors", [False, True])
def test_a_launcher_of_triton_3_7_s_layout_is_never_replayed(env, descriptors):
    # Triton 3.7-3.9 (torch 2.13 pins 3.7.1) call their C launcher with another argument
    # layout; a replay in 3.6's layout would fail or launch garbage. So the call is refused
    # for replays, and later calls take `launch`, whose fast path calls `compiled.run` as
    # JITFunction.run does in every Triton since 3.4.
    k = env.jit(_body if descriptors else _plain, descriptors=descriptors, metas=[META] if descriptors else None,
                launcher=FakeLauncher37)
    x, y = torch.randn(64), torch.randn(8, 64)
    desc = TensorDescriptor(y, [8, 64], [64, 1], [16, 32])
    args = (x, desc, 10, True) if descriptors else (x, 10)
    for _ in range(3):
        rec = Recorder(("new-abi",), _gather, x, y)
        rec.launch(k, (3,), *args, BLOCK=32)
        rec.commit()
    assert not replay(("new-abi",), x, y) and ("new-abi",) in REPLAYS.refused
    assert not REPLAYS.calls and not env.raw
    assert len(env.triton) == 2  # the recording's launch, then `launch` remembering the kernel
    ((compiled, _tail),) = LAUNCHES.entries.values()
    extra = (7,) if descriptors else ()  # EXTRA's default, in parameter order
    assert compiled.run.calls == [(3, 1, 1, 1234, "fn-handle", ("meta",), None, None, None, *args, 32, *extra)]


def test_the_installed_triton_s_launcher_is_read_as_the_replayable_layout_only_where_it_is():
    # Which layout the real CudaLauncher has, read from its Triton's source rather than its
    # version: replays stay on for the Triton the H200 runs (3.6), and off for 3.7+.
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    source = inspect.getsource(driver.CudaLauncher.__call__)
    flat = "global_scratch, profile_scratch, *args)" in source.replace("\n", " ").replace("  ", "")
    assert launch_mod._flat_launcher(object.__new__(driver.CudaLauncher)) is flat
    if triton.__version__.startswith(("3.5.", "3.6.")):
        assert flat


def test_a_dropped_recording_is_not_kept(env):
    k = env.jit(_plain, descriptors=False)
    x, y = torch.randn(64), torch.randn(64)
    rec = Recorder(("k",), _gather, x, y)
    rec.drop()
    rec.launch(k, (1,), x, 5, BLOCK=8)  # through kernels.runtime.launch: Triton's path the first time
    rec.commit()
    assert not REPLAYS.calls and not replay(("k",), x, y)


def test_without_a_key_the_recorder_only_launches(env):
    k = env.jit(_plain, descriptors=False)
    x, y = torch.randn(64), torch.randn(64)
    compiled = []
    for _ in range(2):
        rec = Recorder(None, _gather, x, y)
        compiled.append(rec.launch(k, (1,), x, 5, BLOCK=8))
        rec.commit()
    assert not REPLAYS.calls and len(env.triton) == 1 and not env.raw
    assert len(compiled[0].run.calls) == 1  # the second call took the fast path
    assert replay(None, x, y) is False


class FakeCuda:
    """What call_key reads of a CUDA tensor."""

    is_cuda = True

    def __init__(self, ptr, shape=(4, 8), strides=(8, 1), dtype=torch.bfloat16, device=0):
        self.ptr, self.shape, self.strides, self.dtype, self.device = ptr, shape, strides, dtype, device

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device

    def stride(self):
        return self.strides


def test_the_call_key_holds_layout_alignment_aliasing_and_the_call_s_extras(env, monkeypatch):
    a, b, c = FakeCuda(1024), FakeCuda(4096), FakeCuda(8192)
    base = call_key("s", (a, b, c), "cfg")
    assert base is not None
    assert call_key("s", (FakeCuda(2048), FakeCuda(65536), FakeCuda(16384)), "cfg") == base  # new addresses
    changed = [
        call_key("s", (FakeCuda(1032), b, c), "cfg"),  # 8 bytes off: another pointer specialization
        call_key("s", (FakeCuda(1024, strides=(1, 4)), b, c), "cfg"),  # a transposed view
        call_key("s", (FakeCuda(1024, shape=(4, 9)), b, c), "cfg"),
        call_key("s", (FakeCuda(1024, dtype=torch.float16), b, c), "cfg"),
        call_key("s", (a, a, c), "cfg"),  # a @ a: the same address twice
        call_key("s", (FakeCuda(1024, device=1), b, c), "cfg"),  # another GPU's tensors
        call_key("s", (a, b, c), "other cfg"),
        call_key("t", (a, b, c), "cfg"),
    ]
    assert all(k is not None and k != base for k in changed) and len(set(changed)) == len(changed)
    monkeypatch.setenv("ADVISOR_NUM_SMS", "8")
    assert call_key("s", (a, b, c), "cfg") != base


def test_no_key_where_calls_must_not_be_replayed(env, monkeypatch):
    a = FakeCuda(1024)
    assert call_key("s", (a, torch.zeros(4)), None) is None  # a CPU tensor
    monkeypatch.setattr(REPLAYS, "enabled", False)
    assert call_key("s", (a,), None) is None
    monkeypatch.setattr(REPLAYS, "enabled", True)
    monkeypatch.setattr(LAUNCHES, "enabled", False)  # ADVISOR_FAST_LAUNCH=0: Triton's path throughout
    assert call_key("s", (a,), None) is None
    monkeypatch.setattr(LAUNCHES, "enabled", True)
    monkeypatch.setattr(launch_mod, "_CUDA", False)
    assert call_key("s", (a,), None) is None
    monkeypatch.setattr(launch_mod, "_CUDA", True)

    def hook(metadata):
        return None

    launch_mod._knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert call_key("s", (a,), None) is None
    finally:
        launch_mod._knobs.runtime.launch_enter_hook.remove(hook)
    assert call_key("s", (a,), None) is not None


def test_an_unhashable_key_is_neither_replayed_nor_recorded(env):
    k = env.jit(_plain, descriptors=False)
    x, y = torch.randn(64), torch.randn(64)
    key = ("k", {"BLOCK_M": 16})  # a dict where a config belongs
    assert replay(key, x, y) is False
    rec = Recorder(key, _gather, x, y)
    rec.launch(k, (1,), x, 5, BLOCK=8)
    rec.commit()
    assert rec.key is None and not REPLAYS.calls and len(env.triton) == 1
