"""Exposed communication across ranks: clock alignment, waits, bubbles, slowest rank and the
critical path, on hand-built multi-rank traces (numbers worked out in each test) and on the
real A100 NCCL trace of the corpus."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from synthetic import H100, kernel, make_trace

from advisor.diagnose.diagnosis import diagnose, evidence_frames
from advisor.report.render import render
from advisor.symptoms import Context
from advisor.symptoms import ranks as rk
from advisor.symptoms.intervals import total
from advisor.traces import load_trace, merge

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
AG = "ncclDevKernel_AllGather_RING_LL"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
P = 1_000_000  # step period, ns
OFFSET_1 = 5_000_000  # rank 1's profile clock runs 5 ms ahead of rank 0's


def by_symptom(d, symptom):
    return [f for f in d.findings if f.symptom == symptom]


def devices(n):
    return [dict(H100, rank=r) for r in range(n)]


def imbalanced_pair(outlier_ns=50_000):
    """Two ranks, 4 steps of GEMM -> all-reduce. True clock: rank 0 computes 400 us, rank 1
    600 us (slow); both all-reduces end at step + 800 us, when rank 1's data is in and 200 us
    of transfer are done. Rank 0's all-reduce kernel starts at +400 us (it waits 200 us for
    rank 1 inside the kernel). Rank 1's clock reads OFFSET_1 more, and its last all-reduce
    end is recorded `outlier_ns` late (a profiler delay the median must ignore)."""
    ks = []
    for s in range(4):
        t = s * P
        ks += [kernel(t, 400_000, name=GEMM, grid=(64, 8, 1), stream=7, rank=0),
               kernel(t + 400_000, 400_000, name=AR, grid=(24, 1, 1), stream=20, rank=0)]
        late = outlier_ns if s == 3 else 0
        o = OFFSET_1
        ks += [kernel(o + t, 600_000, name=GEMM, grid=(64, 8, 1), stream=7, rank=1),
               kernel(o + t + 600_000, 200_000 + late, name=AR, grid=(24, 1, 1), stream=13, rank=1)]
    return make_trace(ks, devices=devices(2))


# ----------------------------------------------------------------------------- kinds and keys


@pytest.mark.parametrize(
    "name, kind",
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_reduce"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
        ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
        ("ncclDevKernel_Reduce_Sum_f32_RING_LL", "reduce"),
        ("cross_device_reduce_1stage<__nv_bfloat16, 8>", "all_reduce"),
        ("alltoall", "all_to_all"),
        ("_allgather_base", "all_gather"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("ncclDevKernel_Generic_4", "other"),
    ],
)
def test_collective_kind_from_names(name, kind):
    assert rk.collective_kind(name) == kind


def test_instance_keys_use_stream_order_not_stream_ids():
    # Rank 0 runs the same all-reduce on streams 20 and 21 (two process groups), rank 1 on
    # 40 and 39: the lane is the order of first use, so (lane, seq) match across ranks.
    ks = [
        kernel(0, 10, name=AR, stream=20, rank=0), kernel(50, 10, name=AR, stream=21, rank=0),
        kernel(100, 10, name=AR, stream=20, rank=0),
        kernel(0, 10, name=AR, stream=40, rank=1), kernel(50, 10, name=AR, stream=39, rank=1),
        kernel(100, 10, name=AR, stream=40, rank=1),
    ]
    keyed = rk.instance_keys(pd.DataFrame(ks))
    got = sorted(zip(keyed["rank"], keyed["stream_id"], keyed["lane"], keyed["seq"]))
    assert got == [(0, 20, 0, 0), (0, 20, 0, 1), (0, 21, 1, 0), (1, 39, 1, 0), (1, 40, 0, 0), (1, 40, 0, 1)]


# ----------------------------------------------------------------------------- alignment


def test_planted_offset_is_recovered_despite_an_outlier():
    ctx = Context(imbalanced_pair())
    a = rk.analyze(ctx.kernels, min_matches=3)
    al = a.alignment
    # end differences rank0 - rank1: -5 ms three times and -5.05 ms once: the median is -5 ms
    assert al.status == "aligned" and al.reference_rank == 0
    assert al.offsets_ns == {0: 0, 1: -OFFSET_1}
    assert al.matched == {1: 4} and al.spread_ns == {1: 0}


def test_offsets_of_three_ranks_with_noise():
    # Three ranks, 9 all-gathers each ending at 300 us + 1 ms k on the true clock. Rank r's
    # clock is offset by off[r]; each recorded end carries +-2 us of noise and rank 2 has two
    # wild ends (+400 us, -300 us). The medians still land within the noise.
    rng = np.random.default_rng(7)
    off = {0: 1_000, 1: -2_500_000, 2: 7_777_777}
    ks = []
    for r in range(3):
        for k in range(9):
            end = 300_000 + k * P + off[r] + int(rng.integers(-2_000, 2_001))
            if r == 2 and k == 1:
                end += 400_000
            if r == 2 and k == 6:
                end -= 300_000
            ks.append(kernel(end - 100_000, 100_000, name=AG, stream=30 + r, rank=r))
            ks.append(kernel(k * P + off[r], 150_000, name=GEMM, rank=r))
    ctx = Context(make_trace(ks, devices=devices(3)))
    al = rk.analyze(ctx.kernels, min_matches=3).alignment
    assert al.status == "aligned"
    for r in (1, 2):
        want = off[0] - off[r]
        assert abs(al.offsets_ns[r] - want) <= 4_000, (r, al.offsets_ns[r], want)
        assert al.spread_ns[r] <= 4_000


def test_alignment_impossible_is_said():
    # rank 0 all-reduces, rank 1 all-gathers: no instance in common
    ks = [kernel(i * P, 400_000, name=AR, stream=20, rank=0) for i in range(4)]
    ks += [kernel(i * P, 400_000, name=AG, stream=20, rank=1) for i in range(4)]
    ks += [kernel(i * P + 400_000, 300_000, name=GEMM, rank=r) for r in (0, 1) for i in range(4)]
    d = diagnose(make_trace(ks, devices=devices(2)))
    fs = by_symptom(d, "exposed_comm")
    assert {f.rank for f in fs} == {0, 1}
    for f in fs:
        assert f.evidence["alignment"]["status"] == "unaligned"
        assert "clocks taken as recorded" in f.evidence["alignment"]["reason"]
        assert f.confidence == "low" and f.evidence["wait_ns"] == 0
        assert "critical_path" not in f.evidence  # no path without comparable clocks
        # unaligned: every exposed ns counts (400 us x 4), bounded by compute (300 us x 4)
        assert f.evidence["recoverable_ns"] == 1_600_000 and f.est_savings_ns == 1_200_000


def test_send_recv_only_is_not_aligned_on():
    ks = [kernel(i * P, 100_000, name="ncclDevKernel_SendRecv", stream=20, rank=r) for r in (0, 1) for i in range(4)]
    al = rk.align_clocks(pd.DataFrame(ks), [0, 1], min_matches=1)
    assert al.status == "no_collectives" and al.offsets_ns == {0: 0, 1: 0}


def test_too_few_common_collectives():
    ks = [kernel(i * P, 100_000, name=AR, stream=20, rank=r) for r in (0, 1) for i in range(2)]
    al = rk.align_clocks(pd.DataFrame(ks), [0, 1], min_matches=3)
    assert al.status == "unaligned" and "2 collective(s) in common" in al.notes[0]


def test_unequal_instance_counts_are_noted():
    ks = [kernel(i * P, 100_000, name=AR, stream=20, rank=0) for i in range(5)]
    ks += [kernel(i * P + 42, 100_000, name=AR, stream=20, rank=1) for i in range(4)]
    al = rk.align_clocks(pd.DataFrame(ks), [0, 1], min_matches=3)
    assert al.offsets_ns[1] == -42 and al.matched == {1: 4}
    assert any("matched the first 4" in n for n in al.notes)


# ----------------------------------------------------------------------------- per rank


def test_imbalanced_pair_per_rank_numbers():
    ctx = Context(imbalanced_pair())
    a = rk.analyze(ctx.kernels, min_matches=3, min_bubble_ns=10_000)
    s = a.stats.set_index("rank")
    # rank 0: 4 all-reduces of 400 us, none under compute; waits 200 us in each for rank 1
    r0 = s.loc[0]
    assert (r0["comm_ns"], r0["overlapped_ns"], r0["exposed_ns"]) == (1_600_000, 0, 1_600_000)
    assert (r0["compute_ns"], r0["busy_ns"], r0["span_ns"]) == (1_600_000, 3_200_000, 3_800_000)
    assert (r0["wait_ns"], r0["exposed_wait_ns"], r0["work_ns"]) == (800_000, 800_000, 2_400_000)
    # 200 us idle at the end of steps 0..2: three bubbles
    assert (r0["bubbles"], r0["bubble_ns"], r0["largest_bubble_ns"], r0["idle_ns"]) == (3, 600_000, 200_000, 600_000)
    assert r0["last_arrivals"] == 0
    # rank 1 (slow): 3 x 200 us + 250 us of all-reduce (the late end), no wait, last at all 4
    r1 = s.loc[1]
    assert (r1["comm_ns"], r1["exposed_ns"], r1["wait_ns"]) == (850_000, 850_000, 0)
    assert (r1["compute_ns"], r1["busy_ns"], r1["last_arrivals"]) == (2_400_000, 3_250_000, 4)
    assert r1["bubbles"] == 3 and r1["bubble_ns"] == 3 * 200_000
    # work: rank 0 3.2 ms - 0.8 ms waiting = 2.4 ms < rank 1's 3.25 ms
    assert a.slowest_rank == 1
    assert r0["kinds"]["all_reduce"]["count"] == 4 and r0["kinds"]["all_reduce"]["exposed_ns"] == 1_600_000


def test_critical_path_walks_through_the_slow_rank():
    ctx = Context(imbalanced_pair())
    a = rk.analyze(ctx.kernels, min_matches=3)
    path = a.path
    # On rank 0's clock rank 1's last all-reduce ends last (3.85 ms). Walking back: that
    # all-reduce from rank 1's arrival (3.6 ms), rank 1's GEMM (3.0-3.6 ms, in the window
    # from the previous all-reduce's end at 2.8 ms), ... down to rank 1's first GEMM.
    want = [("compute", 1, 0, 600_000, 600_000)]
    for s in range(3):
        want += [("comm", 1, s * P + 600_000, s * P + 800_000, 200_000),
                 ("compute", 1, s * P + 800_000, (s + 1) * P + 600_000, 600_000)]
    want += [("comm", 1, 3 * P + 600_000, 3 * P + 850_000, 250_000)]
    got = list(zip(path["kind"], path["rank"], path["start_ns"], path["end_ns"], path["busy_ns"]))
    assert got == want
    assert set(path.loc[path["kind"] == "comm", "collective"]) == {"all_reduce"}
    summ = a.path_summary
    assert summ["span_ns"] == 3_850_000 and summ["compute_ns"] == 2_400_000 and summ["comm_ns"] == 850_000
    assert summ["idle_ns"] == 3_850_000 - 2_400_000 - 850_000
    assert summ["compute_by_rank"] == {"1": 2_400_000} and summ["last_arrivals"] == {"1": 4}


def test_findings_split_waiting_from_recoverable():
    d = diagnose(imbalanced_pair())
    fs = {f.rank: f for f in by_symptom(d, "exposed_comm")}
    assert set(fs) == {0, 1}
    f0, f1 = fs[0], fs[1]
    # rank 0: 1.6 ms exposed, 0.8 ms of it waiting for rank 1: 0.8 ms recoverable
    assert f0.evidence["exposed_ns"] == 1_600_000 and f0.evidence["exposed_wait_ns"] == 800_000
    assert f0.evidence["recoverable_ns"] == 800_000 and f0.est_savings_ns == 800_000
    assert f1.est_savings_ns == 850_000 and f1.evidence["wait_ns"] == 0
    for f in (f0, f1):
        assert f.strategy == "comm_overlap" and f.confidence == "medium"
        assert f.evidence["slowest_rank"] == 1 and f.evidence["ranks"] == 2
        assert f.evidence["alignment"]["status"] == "aligned"
        assert f.evidence["critical_path"]["compute_by_rank"] == {"1": 2_400_000}
        assert f.suggestion["collective"] == "all_reduce" and f.suggestion["chunks"] == 2
        assert f.kernel == AR
    assert fs[1].evidence["alignment"]["offset_ns"] == -OFFSET_1
    md = render("diagnosis.md.j2", d=d)
    assert "exposed_comm" in md and "comm_overlap" in md


def test_waiting_for_a_slow_rank_is_not_recoverable():
    # Rank 0 computes 100 us, then sits 800 us in each all-reduce: 780 us waiting for rank 1
    # (880 us of compute) and 20 us of transfer. 3.2 ms of exposed communication, but only
    # 4 x 20 us = 80 us of it is transfer, under min_exposed_ns: imbalance, not overlap.
    ks = []
    for s in range(4):
        t = s * P
        ks += [kernel(t, 100_000, name=GEMM, rank=0), kernel(t + 100_000, 800_000, name=AR, stream=20, rank=0),
               kernel(t, 880_000, name=GEMM, rank=1), kernel(t + 880_000, 20_000, name=AR, stream=20, rank=1)]
    trace = make_trace(ks, devices=devices(2))
    assert by_symptom(diagnose(trace), "exposed_comm") == []
    ev = evidence_frames(trace)["exposed_comm"].set_index("rank")
    assert ev.loc[0, "exposed_ns"] == 3_200_000 and ev.loc[0, "exposed_wait_ns"] == 4 * 780_000
    assert list(ev["recoverable_ns"]) == [80_000, 80_000]
    assert ev.attrs["slowest_rank"] == 1


def test_overlapped_ranks_are_clean():
    # Both ranks hide every all-gather under a GEMM on another stream.
    ks = []
    for r in (0, 1):
        for s in range(4):
            t = s * P + r * 333
            ks += [kernel(t, 900_000, name=GEMM, stream=7, rank=r), kernel(t + 100_000, 500_000, name=AG, stream=20, rank=r)]
    d = diagnose(make_trace(ks, devices=devices(2)))
    assert by_symptom(d, "exposed_comm") == []
    ev = evidence_frames(make_trace(ks, devices=devices(2)))["exposed_comm"]
    assert (ev["exposed_ns"] == 0).all() and (ev["overlapped_ns"] == 2_000_000).all()
    assert ev.attrs["alignment"]["offsets_ns"] == {"0": 0, "1": -333}


def _peer_copy(start, dur, rank, stream=30):
    return {"rank": rank, "device_id": 0, "stream_id": stream, "correlation_id": None, "start_ns": start,
            "end_ns": start + dur, "dur_ns": dur, "op": "memcpy", "kind": "PtoP", "bytes": 8 << 20}


def _copy_engine_step(hidden: bool):
    """Two ranks, four steps of a copy-engine transport: a symmetric-memory barrier kernel,
    then a 400 us peer-to-peer copy of the peer's rows, and a 900 us GEMM: under the copy on
    a side stream (hidden) or after it (exposed)."""
    ks, cps = [], []
    for r in (0, 1):
        for s in range(4):
            t = s * 2 * P + r * 500
            ks.append(kernel(t, 5_000, name="barrier_kernel", stream=7, rank=r))
            cps.append(_peer_copy(t + 5_000, 400_000, r))
            ks.append(kernel(t + (5_000 if hidden else 405_000), 900_000, name=GEMM, stream=7, rank=r))
    return make_trace(ks, devices=devices(2), memcpy=cps)


def test_peer_copies_and_barrier_kernels_are_communication():
    # Copy-engine transports (symmetric memory) move bytes with memcpy PtoP, ordered by
    # barrier kernels: exposed, they are flagged like NCCL kernels; aligned on the barriers.
    d = diagnose(_copy_engine_step(hidden=False))
    fs = by_symptom(d, "exposed_comm")
    assert {f.rank for f in fs} == {0, 1}
    for f in fs:
        kinds = f.evidence["collectives"]
        assert kinds["peer_copy"]["exposed_ns"] == 4 * 400_000 and kinds["barrier"]["count"] == 4
        assert f.evidence["hidden_fraction"] == 0 and f.confidence == "medium"
        assert f.evidence["alignment"]["status"] == "aligned"  # on the barriers, not the one-sided copies
        assert f.suggestion["pattern"].startswith("chunked collective")
    # Hidden under the GEMM: only the barriers stay exposed, far under the thresholds.
    assert by_symptom(diagnose(_copy_engine_step(hidden=True)), "exposed_comm") == []
    assert rk.collective_kind("Memcpy PtoP (Device -> Device)") == "peer_copy"
    assert rk.collective_kind("barrier_kernel") == "barrier"
    assert rk.collective_kind("grid_barrier_kernel_v2") == "barrier"


def test_mostly_overlapped_schedule_gets_trimming_advice():
    # Each all-gather runs 300 us beside the GEMM and 150 us after it (2/3 hidden): still
    # over the thresholds, but the finding says the schedule is already overlapped.
    ks = []
    for r in (0, 1):
        for s in range(4):
            t = s * P + r * 250
            ks += [kernel(t, 600_000, name=GEMM, stream=7, rank=r), kernel(t + 300_000, 450_000, name=AG, stream=20, rank=r)]
    fs = by_symptom(diagnose(make_trace(ks, devices=devices(2))), "exposed_comm")
    assert {f.rank for f in fs} == {0, 1}
    for f in fs:
        assert f.evidence["hidden_fraction"] == pytest.approx(2 / 3, abs=1e-3)
        assert f.confidence == "low" and f.suggestion["pattern"].startswith("already overlapped")
        assert "already overlapped" in f.title
        assert "schedule" not in f.suggestion and "p2p" in f.suggestion["try"]


def test_message_sizes_when_the_trace_has_them():
    # The kernels frame does not carry Kineto's comm args yet (see ranks.SIZE_COLUMNS):
    # add them the way the reader would and check the per-kind sizes. The all-to-all runs as
    # NCCL SendRecv kernels; Kineto's collective name tells it apart.
    ks = [kernel(i * P, 400_000, name=AG, stream=20) for i in range(3)]
    ks += [kernel(i * P + 500_000, 200_000, name="ncclDevKernel_SendRecv", stream=20) for i in range(2)]
    ks += [kernel(i * P + 400_000, 100_000, name=GEMM) for i in range(3)]
    t = make_trace(ks)
    k = t.kernels
    comm = k["name"] != GEMM
    k["comm_name"] = pd.array([("_allgather_base" if n == AG else "all_to_all") if c else None for n, c in zip(k["name"], comm)], dtype="string")
    k["comm_in_nelems"] = pd.array([(1 << 20 if n == AG else 3 << 20) if c else None for n, c in zip(k["name"], comm)], dtype="Int64")
    k["comm_out_nelems"] = pd.array([(2 << 20 if n == AG else 3 << 20) if c else None for n, c in zip(k["name"], comm)], dtype="Int64")
    k["comm_dtype"] = pd.array(["BFloat16" if c else None for c in comm], dtype="string")
    k["comm_group_size"] = pd.array([8 if c else None for c in comm], dtype="Int64")
    ev = evidence_frames(t)["exposed_comm"]
    kinds = ev.loc[0, "kinds"]
    ag, a2a = kinds["all_gather"], kinds["all_to_all"]
    assert (ag["count"], ag["median_in_bytes"], ag["median_out_bytes"]) == (3, 2 << 20, 4 << 20)
    assert ag["total_bytes"] == 3 * (4 << 20)
    assert ag["algbw_gbps"] == pytest.approx(3 * (4 << 20) / 1_200_000, abs=0.01)
    assert (a2a["count"], a2a["median_in_bytes"], a2a["group_size"]) == (2, 6 << 20, 8)
    assert "send_recv" not in kinds


# ----------------------------------------------------------------------------- from files


def _kineto_doc(rank, base_ns, events):
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "baseTimeNanoseconds": base_ns, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132,
                                                                   "computeMajor": 9, "computeMinor": 0}],
            "traceEvents": events}


def _kev(name, ts_us, dur_us, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts_us, "dur": dur_us,
            "args": {"device": 0, "stream": stream, "grid": [24, 1, 1], "block": [512, 1, 1]}}


def test_two_kineto_files_with_different_clock_origins(tmp_path):
    # Rank 0 and rank 1 wrote their files with base times 10 s apart but the same relative
    # timeline except that rank 1 starts its all-gathers 150 us later (it computes longer).
    paths = []
    for rank, base, extra in ((0, 1_700_000_000_000_000_000, 0), (1, 1_700_000_010_000_000_000, 150)):
        evs = []
        for s in range(4):
            t = 1000.0 * s
            evs.append(_kev(GEMM, t, 300 + extra, 7))
            evs.append(_kev(AG, t + 300 + extra, 400 - extra, 20))
        p = tmp_path / f"rank{rank}.json.gz"
        with gzip.open(p, "wt") as fh:
            json.dump(_kineto_doc(rank, base, evs), fh)
        paths.append(p)
    t = load_trace([paths[1], paths[0]])  # order of the arguments does not matter
    assert t.ranks == [0, 1]
    d = diagnose(t)
    fs = {f.rank: f for f in by_symptom(d, "exposed_comm")}
    assert fs[1].evidence["alignment"]["offset_ns"] == -10_000_000_000
    # rank 0 waits 150 us in each of 4 all-gathers; its 400 us kernels are 250 us transfer
    assert fs[0].evidence["wait_ns"] == 600_000 and fs[0].evidence["recoverable_ns"] == 1_000_000
    assert fs[0].evidence["slowest_rank"] == 1


def test_corpus_a100_nccl(corpus, tmp_path):
    path = corpus / "kineto" / "hta_a100_nccl.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} not in the corpus")
    t = load_trace(path)
    k = t.kernels
    comm = k[k["name"].str.startswith("nccl")]
    compute = k[~k["name"].str.startswith("nccl")]
    # independent check of the union and overlap, one kernel at a time
    merged = []  # communication intervals, merged by hand
    for a, b in sorted(zip(comm["start_ns"], comm["end_ns"])):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    comm_ns = sum(b - a for a, b in merged)
    covered = 0
    cs = list(zip(compute["start_ns"], compute["end_ns"]))
    for a, b in merged:
        inside = [(max(a, s), min(b, e)) for s, e in cs if s < b and e > a]
        covered += total([x for x, _ in inside], [y for _, y in inside]) if inside else 0
    ev = evidence_frames(t)["exposed_comm"]
    row = ev.iloc[0]
    assert row["comm_ns"] == comm_ns and row["comm_kernels"] == len(comm) == 21
    assert row["overlapped_ns"] == covered and row["exposed_ns"] == comm_ns - covered
    assert row["kinds"]["all_reduce"]["count"] == 15 and row["kinds"]["broadcast"]["count"] == 6
    # Message sizes from the NCCL kernels' own args, computed here from the raw JSON.
    import gzip
    import json
    import statistics

    with gzip.open(path, "rt") as fh:
        raw = json.load(fh)
    sizes = {"Float": 4, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Byte": 1, "Char": 1}
    ar = [e["args"] for e in raw["traceEvents"] if e.get("cat") == "kernel" and "AllReduce" in e.get("name", "")]
    want = statistics.median(a["In msg nelems"] * sizes[a["dtype"]] for a in ar)
    assert row["kinds"]["all_reduce"]["median_in_bytes"] == pytest.approx(want)
    assert ev.attrs["alignment"]["status"] == "single_rank"
    (f,) = by_symptom(diagnose(t), "exposed_comm")
    assert f.suggestion["collective"] == "all_reduce" and f.evidence["exposed_fraction"] > 0.1

    # The same trace as two ranks, rank 1's clock shifted: the shift comes back exactly (the
    # collectives are identical), and both ranks get the single-rank numbers. Built with
    # merge(): load_trace refuses one profile given twice (test_unrelated_ranks.py).
    t2 = merge([load_trace(path), load_trace(path)])
    shift = 123_456_789
    t2.kernels.loc[t2.kernels["rank"] == 1, ["start_ns", "end_ns"]] += shift
    ev2 = evidence_frames(t2)["exposed_comm"]
    assert ev2.attrs["alignment"]["status"] == "aligned"
    assert ev2.attrs["alignment"]["offsets_ns"] == {"0": 0, "1": -shift}
    for col in ("comm_ns", "overlapped_ns", "exposed_ns", "compute_ns", "bubbles"):
        assert list(ev2[col]) == [row[col], row[col]]
    assert list(ev2["wait_ns"]) == [0, 0]  # identical ranks: nobody waits
