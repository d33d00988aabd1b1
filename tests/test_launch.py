"""kernels/runtime.py: the fast launch path, on the CPU with a stand-in for Triton's compiled
kernel (the real one needs a GPU; experiments/profile_host.py times it there)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels import runtime as launch_mod
from kernels.runtime import LAUNCHES, launch


def _body(x_ptr, n, flag, BLOCK: tl.constexpr, EXTRA: tl.constexpr = 7):
    pass


class FakeCompiled:
    function = "fn-handle"
    packed_metadata = ("meta",)

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("fast", args))


@pytest.fixture
def kernel(monkeypatch):
    """A real JITFunction whose compile-and-launch (`run`) is replaced by a recorder."""
    LAUNCHES.clear()
    k = triton.runtime.JITFunction(_body)
    log = []

    def fake_run(*args, grid, warmup, **kwargs):
        log.append(("slow", grid, args, kwargs))
        return FakeCompiled(log)

    k.run = fake_run
    monkeypatch.setattr(launch_mod, "_CUDA", True)  # this machine may have no GPU
    monkeypatch.setattr(launch_mod, "_current_device", lambda: 0)
    monkeypatch.setattr(launch_mod, "_current_stream", lambda device: 1234)
    k.log = log
    yield k
    LAUNCHES.clear()


def test_second_identical_launch_skips_binding_and_passes_every_parameter_in_order(kernel):
    x = torch.zeros(64)
    assert isinstance(launch(kernel, (5,), x, 10, True, BLOCK=32, num_warps=4), FakeCompiled)
    assert launch(kernel, (5,), x, 10, True, BLOCK=32, num_warps=4) is None
    kind, args = kernel.log[-1]
    assert kind == "fast"
    # grid padded to 3-D, the stream, function, metadata, no launch metadata or hooks, then
    # the positional arguments, the keyword parameters in order and the unpassed default
    assert args == (5, 1, 1, 1234, "fn-handle", ("meta",), None, None, None, x, 10, True, 32, 7)
    assert [e[0] for e in kernel.log] == ["slow", "fast"]


def test_a_new_tensor_at_the_same_alignment_reuses_the_kernel(kernel):
    launch(kernel, (1,), torch.zeros(64), 3, False, BLOCK=16)
    y = torch.zeros(64)
    launch(kernel, (2,), y, 3, False, BLOCK=16)
    assert kernel.log[-1][0] == "fast" and kernel.log[-1][1][9] is y and kernel.log[-1][1][0] == 2


@pytest.mark.parametrize("change", ["alignment", "scalar", "bool_for_int", "dtype", "constexpr", "option"])
def test_anything_triton_specializes_on_sends_the_call_through_triton(kernel, change):
    base = torch.zeros(64, dtype=torch.float32)
    launch(kernel, (1,), base, 16, False, BLOCK=16, num_warps=4)
    args, kwargs = [base, 16, False], {"BLOCK": 16, "num_warps": 4}
    if change == "alignment":
        args[0] = base[1:]  # 4 bytes off: no longer 16-byte aligned
    elif change == "scalar":
        args[1] = 17
    elif change == "bool_for_int":
        args[2] = 0  # equal to False, but an int: another specialization
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    elif change == "constexpr":
        kwargs["BLOCK"] = 32
    else:
        kwargs["num_warps"] = 8
    launch(kernel, (1,), *args, **kwargs)
    assert [e[0] for e in kernel.log] == ["slow", "slow"]
    launch(kernel, (1,), *args, **kwargs)
    assert kernel.log[-1][0] == "fast"


def test_a_tensor_passed_by_keyword_refuses_the_kernel(kernel):
    x = torch.zeros(8)
    for _ in range(3):
        launch(kernel, (1,), x, 1, False, BLOCK=torch.zeros(1))
    assert [e[0] for e in kernel.log] == ["slow"] * 3
    assert id(kernel) in LAUNCHES.refused and not LAUNCHES.entries


def test_unkeyable_positional_arguments_and_callable_grids_go_through_triton(kernel):
    x = torch.zeros(8)
    for _ in range(2):
        launch(kernel, (1,), x, object(), False, BLOCK=4)
        launch(kernel, lambda meta: (1,), x, 1, False, BLOCK=4)
    assert [e[0] for e in kernel.log] == ["slow"] * 4


def test_an_attached_launch_hook_keeps_the_normal_path(kernel, monkeypatch):
    x = torch.zeros(8)
    launch(kernel, (1,), x, 1, False, BLOCK=4)
    def hook(metadata):
        return None

    launch_mod._knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch(kernel, (1,), x, 1, False, BLOCK=4)
    finally:
        launch_mod._knobs.runtime.launch_enter_hook.remove(hook)
    assert [e[0] for e in kernel.log] == ["slow", "slow"]
    launch(kernel, (1,), x, 1, False, BLOCK=4)
    assert kernel.log[-1][0] == "fast"


def test_the_interpreter_always_takes_triton_s_path():
    calls = []

    class Interpreted:  # not a JITFunction, as under TRITON_INTERPRET=1
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k))

    k = Interpreted()
    launch(k, (3,), 1, X=2)
    launch(k, (3,), 1, X=2)
    assert calls == [((3,), (1,), {"X": 2})] * 2


def test_a_replaced_triton_launch_or_no_gpu_keeps_the_normal_path(kernel, monkeypatch):
    x = torch.zeros(8)
    launch(kernel, (1,), x, 1, False, BLOCK=4)
    original = triton.runtime.JITFunction.run
    monkeypatch.setattr(triton.runtime.JITFunction, "run", lambda self, *a, **k: original(self, *a, **k))
    launch(kernel, (1,), x, 1, False, BLOCK=4)
    monkeypatch.setattr(triton.runtime.JITFunction, "run", original)
    monkeypatch.setattr(launch_mod, "_CUDA", False)
    launch(kernel, (1,), x, 1, False, BLOCK=4)
    assert [e[0] for e in kernel.log] == ["slow", "slow", "slow"]
    monkeypatch.setattr(launch_mod, "_CUDA", True)
    launch(kernel, (1,), x, 1, False, BLOCK=4)
    assert kernel.log[-1][0] == "fast"


def test_it_can_be_switched_off(kernel, monkeypatch):
    x = torch.zeros(8)
    monkeypatch.setattr(LAUNCHES, "enabled", False)
    for _ in range(2):
        launch(kernel, (1,), x, 1, False, BLOCK=4)
    assert [e[0] for e in kernel.log] == ["slow", "slow"]


def test_an_unhashable_keyword_goes_through_triton_instead_of_failing(kernel):
    x = torch.zeros(8)
    for _ in range(2):
        launch(kernel, (1,), x, 1, False, BLOCK=[4, 4])
    assert [e[0] for e in kernel.log] == ["slow", "slow"] and id(kernel) in LAUNCHES.refused


@pytest.mark.parametrize("version, known", [
    ("3.6.0", True), ("3.5.1", True), ("3.6.0+git1a2b3c", True),
    ("3.4.0", False), ("3.7.0", False), ("4.0.0", False), ("nightly", False), ("", False),
])
def test_the_version_gate_knows_only_the_tritons_the_runtime_was_written_for(version, known):
    reason = launch_mod.version_gate(version)
    assert (reason is None) == known
    if not known:
        assert version in reason and "normal way" in reason and "\n" not in reason


def test_outside_the_gate_every_launch_takes_the_normal_path_and_says_so_once(kernel, monkeypatch):
    monkeypatch.setattr(launch_mod, "GATE", launch_mod.version_gate("3.9.0"))
    monkeypatch.setattr(LAUNCHES, "warned", False)
    x = torch.zeros(64)
    with pytest.warns(RuntimeWarning, match="Triton 3.9.0") as caught:
        for _ in range(3):
            assert isinstance(launch(kernel, (5,), x, 10, True, BLOCK=32), FakeCompiled)
        # no replay key either: a schedule's matmul runs its own path
        assert launch_mod.call_key("dp", (x,)) is None
    assert len(caught) == 1
    assert [e[0] for e in kernel.log] == ["slow"] * 3 and not LAUNCHES.entries


def test_the_installed_triton_is_inside_the_gate():
    # the GPU machine runs 3.6: the fast path must stay on there (docs/host_overhead.md)
    assert launch_mod.GATE is None, launch_mod.GATE
