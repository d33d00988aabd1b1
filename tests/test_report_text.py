"""The diagnosis report's words agree with its numbers."""

from __future__ import annotations

from synthetic import kernel, make_trace

from advisor.diagnose.diagnosis import diagnose
from advisor.report.render import render


def test_exposed_comm_says_when_compute_bounds_the_recoverable_time():
    # 1 ms of all-reduce, none of it hidden, and only 200 us of compute on the device to hide
    # it behind: the table's est. recoverable is 200 us while the evidence's recoverable_ns
    # (the exposed transfer time) says 1 ms; the report must say why they differ
    ks = [
        kernel(0, 1_000_000, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", grid=(24, 1, 1), stream=20),
        kernel(1_000_000, 200_000, name="sm90_xmma_gemm_bf16_tilesize128x128x64", grid=(64, 8, 1), stream=7),
    ]
    d = diagnose(make_trace(ks))
    (f,) = [f for f in d.findings if f.symptom == "exposed_comm"]
    assert f.est_savings_ns == 200_000 and f.evidence["recoverable_ns"] == 1_000_000
    md = render("diagnosis.md.j2", d=d, images={})
    assert ("\n- Recoverable: 200.0 us, the compute on this device that the 1.00 ms of exposed communication "
            "could hide behind (overlap hides communication behind compute, no more)") in md, md

