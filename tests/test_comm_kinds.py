"""Which kernels are communication, and which collective each runs (issue 36 Readers, issue
32 class 8), on real traces: DeepEP's MoE dispatch/combine kernels are an all-to-all; RCCL's
`ncclDevKernel_Generic` is named by the `nccl:<collective>` range around its launch."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from advisor.symptoms import ranks as rk
from advisor.symptoms.context import Context
from advisor.symptoms.exposed_comm import with_range_collectives
from advisor.symptoms.gemm import _COMM
from advisor.traces import load_trace


def raw_events(path):
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@pytest.mark.parametrize("name,comm", [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclDevKernel_AllReduce_Sum_bf16_NVLS(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "send_recv"),
    ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", "other"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 8, 4>(...)", "all_reduce"),
    ("mscclKernel_Sum_half_Simple_false(int, int, mscclAlgo*, mscclWork*)", "other"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)", "all_to_all"),
    ("void deep_ep::internode_ll::combine<false, 7168>(void*, void*)", "all_to_all"),
])
def test_comm_kernel_names(name, comm):
    assert _COMM.search(name)
    assert rk.collective_kind(name) == comm


def test_get_dispatch_layout_is_compute():
    assert not _COMM.search("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*)")


def test_deepep_dispatch_combine_are_all_to_all(corpus):
    path = corpus / "kineto" / "deepseek_h800_moe_dualpipe_train.json.gz"
    raw = Counter(e["name"].split("<")[0] for e in raw_events(path) if e.get("cat") == "kernel" and "::ep::internode::" in e["name"])
    want = sum(n for k, n in raw.items() if k.endswith(("dispatch", "combine")))
    assert want > 0
    k = Context(load_trace(path)).kernels
    comm = k[k["is_comm"]]
    assert len(comm) == want  # before: 0, DeepEP's kernels counted as compute
    assert set(rk.collective_kinds(comm)) == {"all_to_all"}


def test_generic_rccl_kernels_named_by_their_range(corpus):
    path = corpus / "kineto" / "tracelens_mi300_8rank_rccl_resnet.json.gz"
    ev = raw_events(path)
    # from the raw trace: each Generic kernel's launch call (same correlation), then the
    # nccl:<collective> user annotation on that thread covering the call
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ann = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    want = Counter()
    for e in ev:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_Generic"):
            c = launch.get(e["args"]["correlation"])
            hit = [a for a in ann if c and a["tid"] == c["tid"] and a["ts"] <= c["ts"] <= a["ts"] + a["dur"]]
            want[hit[-1]["name"].split(":")[1] if hit else "other"] += 1
    assert want["all_reduce"] == 6 and want["broadcast"] == 6
    t = load_trace(path)
    k = with_range_collectives(Context(t).kernels, t)
    got = Counter(rk.collective_kinds(k[k["is_comm"]]))
    assert got == want
