"""Python loops over a sequence's positions (advisor/symptoms/position_loops.py): found from the
recorded aten::select calls (dims, and dim and index in Concrete Inputs), turned into a
launch_overhead finding with strategy fused_scan whose gaps leave the run finding's claim."""

from __future__ import annotations

import dataclasses
import glob
import json

import pytest
from conftest import DATA
from synthetic import kernel, launch, make_trace

from advisor.diagnose.diagnosis import diagnose
from advisor.rules import load_rules
from advisor.symptoms.context import Context
from advisor.symptoms.position_loops import position_loops
from advisor.traces import load_trace

EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(...)"
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, MulFunctor<float>>>(...)"


class Loop:
    """One host thread: aten::select calls (with Concrete Inputs) and tiny kernels launched
    between them, 30 us apart (a launch-bound Python loop)."""

    def __init__(self):
        self.ops, self.kernels, self.runtime, self.t, self.corr = [], [], [], 0, 0

    def select(self, shape, dim, index):
        self.ops.append({"rank": 0, "thread_id": 1, "start_ns": self.t, "end_ns": self.t + 2000, "dur_ns": 2000,
                         "name": "aten::select", "input_dims": json.dumps([shape, [], []]),
                         "input_types": json.dumps(["float", "Scalar", "Scalar"]), "input_strides": None,
                         "concrete_inputs": json.dumps(["", str(dim), str(index)])})
        self.t += 3000
        return self

    def kernel(self, name=EW, dur=3000):
        self.corr += 1
        self.runtime.append(launch(self.corr, self.t, dur=2000))
        self.kernels.append(kernel(self.t + 5000, dur, name=name, grid=(64, 1, 1), corr=self.corr))
        self.t += 30_000
        return self

    def walk(self, shape, dim, indices, selects=3, kernels=3):
        for i in indices:
            for _ in range(selects):
                self.select(shape, dim, i)
            for j in range(kernels):
                self.kernel(MUL if j % 2 else EW)
        return self

    def trace(self):
        return make_trace(self.kernels, runtime=self.runtime, cpu_ops=self.ops)


def _loops(trace, positions=32):
    return position_loops(Context(trace, load_rules()), positions)


def test_a_walk_over_a_sequence_dim_is_a_loop():
    t = Loop().walk([2, 64, 32], 1, range(64)).trace()
    (loop,) = _loops(t).to_dict("records")
    assert loop["positions"] == 64 and loop["selects"] == 64 * 3
    assert json.loads(loop["tensors"]) == [[[2, 64, 32], 1]]


@pytest.mark.parametrize("shape, dim, indices", [
    ([64, 32, 32], 0, range(64)),  # a stack of weights (experts, layers) taken one by one: dim 0
    ([2, 64, 32], 1, [-1] * 64),  # a decode loop picking the last position each time
    ([2, 64, 32], 1, range(20)),  # too short a walk
    ([2, 64, 32], 1, list(range(0, 64, 2))),  # every other position: not one step at a time
])
def test_what_is_not_a_position_loop(shape, dim, indices):
    assert _loops(Loop().walk(shape, dim, indices).trace()).empty


def test_reverse_and_negative_walks_and_several_tensors_a_position():
    t = Loop().walk([2, 40, 8], -2, range(-1, -41, -1)).trace()  # backwards, negative indices
    (loop,) = _loops(t).to_dict("records")
    assert loop["positions"] == 40 and json.loads(loop["tensors"]) == [[[2, 40, 8], 1]]
    # two tensors selected at each position (Mamba's A and C): one loop
    b = Loop()
    for i in range(48):
        b.select([1, 96, 48, 16], 2, i).select([1, 48, 16], 1, i).kernel().kernel(MUL)
    (loop,) = _loops(b.trace()).to_dict("records")
    assert loop["positions"] == 48 and len(json.loads(loop["tensors"])) == 2


def _without_loops(rules):
    lo = rules["launch_overhead"]
    th = dict(lo.thresholds)
    th["min_loop_positions"] = dataclasses.replace(th["min_loop_positions"], value=10**9)
    return {**rules, "launch_overhead": dataclasses.replace(lo, thresholds=th)}


def test_the_loop_is_its_own_finding_and_its_gaps_leave_the_runs():
    b = Loop()
    for _ in range(40):  # tiny kernels outside the loop, in the same run
        b.kernel()
    b.walk([2, 64, 32], 1, range(64))
    t = b.trace()
    d = diagnose(t)
    (scan,) = [f for f in d.findings if f.strategy == "fused_scan"]
    (run,) = [f for f in d.findings if f.symptom == "launch_overhead" and f.strategy != "fused_scan"]
    assert scan.symptom == "launch_overhead" and scan.tier == 1 and scan.savings_unit == "wall"
    assert scan.launches == 64 * 3 and scan.evidence["kernels_per_position"] == 3.0
    assert scan.evidence["loops"] == [{"tensors": [{"shape": [2, 64, 32], "dim": 1}], "positions": 64, "loops": 1}]
    assert run.evidence["position_loop_gap_ns"] > 0
    # one budget: split between the two, the sum the same as without loop detection
    alone = [f for f in diagnose(t, rules=_without_loops(load_rules())).findings if f.savings_unit == "wall"]
    # (each scaled by the profiler's share and rounded down apart: a nanosecond each)
    assert scan.est_savings_ns + run.est_savings_ns == pytest.approx(sum(f.est_savings_ns for f in alone), abs=2)
    assert scan.est_savings_ns > run.est_savings_ns  # the loop holds most of the gaps


def _wall(d):
    return sum(f.est_savings_ns for f in d.findings if f.savings_unit == "wall")


def test_without_concrete_inputs_nothing_changes():
    b = Loop().walk([2, 64, 32], 1, range(64))
    for op in b.ops:
        op["concrete_inputs"] = None
    d = diagnose(b.trace())
    assert not [f for f in d.findings if f.strategy == "fused_scan"]
    assert [(f.strategy, f.est_savings_ns) for f in d.findings] == \
        [(f.strategy, f.est_savings_ns) for f in diagnose(b.trace(), rules=_without_loops(load_rules())).findings]


def test_a_decode_loop_over_a_buffer_is_not_a_recurrence():
    # tokens[:, t] = next_token from the prompt's end (not position 0), and a whole model step
    # a position: neither is a scan's step
    late = Loop().walk([4, 512], 1, range(100, 164))
    assert _loops(late.trace()).empty
    heavy = Loop().walk([4, 512], 1, range(64), kernels=60)
    assert len(_loops(heavy.trace())) == 1
    assert not [f for f in diagnose(heavy.trace()).findings if f.strategy == "fused_scan"]


def test_two_ranks_and_a_gemm_run_on_the_same_stream_keep_one_budget():
    b = Loop()
    for i in range(40):  # a loop of small GEMMs on the same stream first (its own run finding)
        b.kernel(name="void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(...)")
    for k in b.kernels:
        k["is_gemm"] = True
    b.kernel(dur=300_000)  # ends that run
    b.walk([2, 64, 32], 1, range(64))
    one = b.trace()
    other = Loop().walk([2, 64, 32], 1, range(64))
    for row in other.kernels + other.runtime + other.ops:
        row["rank"] = 1
    two = make_trace(b.kernels + other.kernels, runtime=b.runtime + other.runtime, cpu_ops=b.ops + other.ops)
    for t in (one, two):
        d = diagnose(t)
        assert _wall(d) == pytest.approx(_wall(diagnose(t, rules=_without_loops(load_rules()))), abs=8)
    scans = [f for f in diagnose(two).findings if f.strategy == "fused_scan"]
    assert sorted(f.rank for f in scans) == [0, 1]


def test_a_long_kernel_inside_the_loop_is_no_gap():
    b = Loop()
    for i in range(64):
        for _ in range(3):
            b.select([2, 64, 32], 1, i)
        b.kernel().kernel(MUL).kernel(dur=100_000)  # a 100 us kernel each position: not tiny
    d = diagnose(b.trace())
    assert _wall(d) == pytest.approx(_wall(diagnose(b.trace(), rules=_without_loops(load_rules()))), abs=8)
    for f in d.findings:
        if f.strategy == "fused_scan":
            # only the gaps inside runs of tiny kernels: between the two tiny ones, never the long kernel's time
            assert f.est_savings_ns <= 64 * 30_000


@pytest.mark.parametrize("concrete, dims, name", [
    ('{"a": 1}', "[[2, 64, 32], [], []]", "aten::select"),
    ('["", "1", "1e999"]', "[[2, 64, 32], [], []]", "aten::select"),
    ('["", "1", "99999999999999999999999"]', "[[2, 64, 32], [], []]", "aten::select"),
    ('["", "1", "{i}"]', '{"x": 1}', "aten::select"),
    ('["", "1", "{i}"]', '[["x", 64, 32], [], []]', "aten::select"),
    ('["", "1", "{i}"]', "[[64], [], []]", "aten::select"),
    ('["", "1", "{i}"]', "[[2, 64, 32], [], []]", None),
])
def test_hostile_select_records_do_not_break_the_diagnosis(concrete, dims, name):
    b = Loop().walk([2, 64, 32], 1, range(64))
    for i, op in enumerate(b.ops):
        op["concrete_inputs"], op["input_dims"], op["name"] = concrete.replace("{i}", str(i // 3)), dims, name
    for k in b.kernels[::7]:
        k["name"] = None
    diagnose(b.trace())  # no exception


@pytest.mark.parametrize("name, tensors, per", [
    # RecurrentGemma's RG-LRU prefill, 4 recurrent layers x 128 positions, 6 kernels a position
    ("holdout_recurrent_gemma_prefill_bf16.kineto.json.gz", [[[2, 128, 1024], 1]], 6.0),
    # Mamba's slow-path selective scan: discrete_A[:, :, i] and C[:, i] each position, 2 layers
    ("holdout_mamba_prefill_short.kineto.json.gz", [[[1, 1536, 128, 16], 2], [[1, 128, 16], 1]], 4.0),
])
def test_recurrences_stepped_from_python_on_the_h200(name, tensors, per):
    d = diagnose(load_trace(DATA / "h200" / "holdout" / name))
    (scan,) = [f for f in d.findings if f.strategy == "fused_scan"]
    assert [[t["shape"], t["dim"]] for t in scan.evidence["loops"][0]["tensors"]] == tensors
    assert scan.evidence["kernels_per_position"] == per and scan.confidence == "medium"
    # one budget: the run findings gave up what the loop claims
    alone = diagnose(load_trace(DATA / "h200" / "holdout" / name), rules=_without_loops(load_rules()))
    assert _wall(d) == pytest.approx(_wall(alone), abs=4)


@pytest.mark.slow
def test_no_other_committed_trace_has_a_position_loop():
    # every Kineto capture with shapes: only the two loop fixtures walk >= 32 positions
    found = []
    for path in sorted(glob.glob(str(DATA / "**" / "*.kineto.json.gz"), recursive=True)):
        t = load_trace(path)
        if len(_loops(t, load_rules()["launch_overhead"]["min_loop_positions"])):
            found.append(path.split("/")[-1])
    assert found == ["holdout_mamba_prefill_short.kineto.json.gz", "holdout_recurrent_gemma_prefill_bf16.kineto.json.gz"]


def test_each_loop_is_held_to_its_own_kernels_a_position():
    # rank 1's loop (launched first) is a decode-like loop of 60 kernels a position over 40
    # positions, rank 0's a recurrence of 3 over 64: each loop's count over its own positions
    heavy = Loop().walk([2, 40, 32], 1, range(40), kernels=60)
    for row in heavy.kernels + heavy.runtime + heavy.ops:
        row["rank"] = 1
    light = Loop().walk([2, 64, 32], 1, range(64))
    for row in light.kernels:
        row["start_ns"] += 10**9
        row["end_ns"] += 10**9
    for row in light.runtime + light.ops:
        row["start_ns"] += 10**9
        row["end_ns"] += 10**9
    t = make_trace(heavy.kernels + light.kernels, runtime=heavy.runtime + light.runtime, cpu_ops=light.ops + heavy.ops)
    scans = [f for f in diagnose(t).findings if f.strategy == "fused_scan"]
    assert [(f.rank, f.evidence["kernels_per_position"]) for f in scans] == [(0, 3.0)]
