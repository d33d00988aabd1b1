"""advisor/diagnose/step_effect.py: the replay's closed form against the step-by-step rule."""

from __future__ import annotations

import numpy as np

from advisor.diagnose.step_effect import _ends


def test_the_scan_matches_each_kernel_waiting_for_its_launch_and_its_stream():
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        streams = rng.integers(0, 3, n)
        launch = np.sort(rng.uniform(0, 1e6, n))
        dur = rng.uniform(1e3, 3e4, n)
        last, want = {}, -np.inf
        for i in range(n):  # kernels in start order: each starts at its launch or its stream's last end
            e = max(launch[i], last.get(streams[i], -np.inf)) + dur[i]
            last[streams[i]] = e
            want = max(want, e)
        assert np.isclose(_ends(launch, dur, streams), want, rtol=0, atol=1e-3)


def test_no_replay_across_a_call_that_waited_for_the_gpu():
    # pageable_feed_train calls loss.item() every step: each later launch was made only after
    # the GPU drained, so recorded launch times cannot be replayed past it
    from advisor.diagnose.diagnosis import diagnose
    from advisor.traces import load_trace
    from conftest import DATA

    d = diagnose(load_trace(DATA / "h200" / "holdout" / "holdout_pageable_feed_train.kineto.json.gz"))
    gpu = [f for f in d.findings if f.savings_unit == "gpu"]
    assert gpu and all("step_effect_ns" not in f.evidence for f in gpu)


def test_a_kernel_without_a_launch_call_still_holds_its_stream():
    # 20 kernels of 30 us on one stream, all launched at once when the first starts (queued);
    # the first has no launch call. The replay runs them back to back from the first's start:
    # 600 us. (Taken as launched at minus infinity, the first would take no time on the stream
    # and the rest would end 30 us early.)
    from synthetic import H100, kernel, launch, make_trace

    from advisor.diagnose.step_effect import StepReplay
    from advisor.symptoms import Context

    ks, rt = [], []
    for i in range(20):
        ks.append(kernel(100_000 + i * 50_000, 30_000, corr=None if i == 0 else i))
        if i:
            rt.append(launch(i, 100_000))
    rep = StepReplay(Context(make_trace(ks, devices=(H100,), runtime=rt)), 0, 0, {})
    assert rep.ok
    assert rep.base[0] == 20 * 30_000  # the last end, from the first kernel's start
