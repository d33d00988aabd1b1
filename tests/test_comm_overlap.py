"""kernels/comm_overlap.py on the CPU: 2, 3 and 4 processes with the gloo backend check that the
decomposed schedules give the plain ones' results for chunk counts that do and do not divide
the rows, plus the knobs, the validation and the no-multicast environment."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from advisor.codegen.kernel_lib import load

co = load("comm_overlap")

DEADLINE_S = 60

# Random-normal fp32 inputs against a float64 reference: each output element is a sum of
# K*W products (K=16 per rank, W ranks for the reduce-scatter) rounded in fp32; its rms
# relative error is about sqrt(K*W) * 2^-24 = 4.8e-7 at W=4, so 2e-6 leaves 4x margin.
FP32_REL_TOL = 2e-6


def run_ranks(world: int, worker, tmp_path: Path, *args) -> list[dict]:
    """Run worker(rank, world, store, out_dir, *args) in `world` forked processes joined by a
    gloo group; return each rank's JSON result. Fork (not spawn) keeps this fast: the
    children do not import torch again."""
    store = tmp_path / f"store{world}"
    ctx = mp.start_processes(worker, args=(world, str(store), str(tmp_path), *args), nprocs=world,
                             start_method="fork", join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{world} ranks did not finish in {DEADLINE_S} s")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _init(rank, world, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _ints(gen, *shape):
    return torch.randint(-4, 5, shape, generator=gen).to(torch.float32)


def _rel(out, ref):
    return (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()


def _equivalence_worker(rank, world, store, out_dir, m, mo, K, N):
    _init(rank, world, store)
    checks = 0
    try:
        # Integer-valued fp32 inputs: every product and partial sum is exact, so every
        # summation order gives the same bits and the schedules must agree exactly.
        gen = torch.Generator().manual_seed(100 + rank)
        x, w, a = _ints(gen, m, K), _ints(gen, K, N), _ints(gen, mo * world, K)
        ref_ag = co.all_gather_matmul_reference(x, w)
        ref_rs = co.matmul_reduce_scatter_reference(a, w)
        assert ref_ag.shape == (world * m, N) and ref_rs.shape == (mo, N)
        for chunks in (1, 2, 3, 4, m, m + 3):
            for local_first in (True, False):
                for side in (True, False):
                    for gemm in ("bmm", "mm"):
                        cfg = co.Config(chunks=chunks, local_first=local_first, comm_stream=side, gemm=gemm)
                        got = co.all_gather_matmul(x, w, cfg)
                        assert torch.equal(got, ref_ag), f"rank {rank}: all_gather_matmul {cfg}"
                        checks += 1
        for chunks in (1, 2, 3, 4, mo, mo + 2):
            for gemm in ("bmm", "mm"):
                cfg = co.Config(chunks=chunks, gemm=gemm)
                got = co.matmul_reduce_scatter(a, w, cfg)
                assert torch.equal(got, ref_rs), f"rank {rank}: matmul_reduce_scatter {cfg}"
                checks += 1

        # Random normal data against float64 truth built from every rank's shard (each rank
        # regenerates all shards from their seeds).
        shards = [torch.Generator().manual_seed(500 + q) for q in range(world)]
        xs = [torch.randn(m, K, generator=s) for s in shards]
        ws = [torch.randn(K, N, generator=s) for s in shards]
        As = [torch.randn(mo * world, K, generator=s) for s in shards]
        truth_ag = torch.cat(xs).double() @ ws[rank].double()
        truth_rs = sum(A.double() @ W.double() for A, W in zip(As, ws))[rank * mo:(rank + 1) * mo]
        for cfg in (co.Config(chunks=3), co.Config(chunks=2, local_first=False), co.Config(chunks=4, gemm="mm")):
            assert _rel(co.all_gather_matmul(xs[rank], ws[rank], cfg), truth_ag) <= FP32_REL_TOL
            assert _rel(co.matmul_reduce_scatter(As[rank], ws[rank], cfg), truth_rs) <= FP32_REL_TOL
            checks += 2
        assert _rel(co.all_gather_matmul_reference(xs[rank], ws[rank]), truth_ag) <= FP32_REL_TOL
        # The GPU-only knobs run the same schedule on gloo (no CTAs to cap, no SMs to leave);
        # the copy-engine transport refuses on every rank alike, with the reason.
        knobs = co.Config(chunks=2, comm_ctas=8, sm_carveout=4)
        assert _rel(co.all_gather_matmul(xs[rank], ws[rank], knobs), truth_ag) <= FP32_REL_TOL
        assert _rel(co.matmul_reduce_scatter(As[rank], ws[rank], knobs), truth_rs) <= FP32_REL_TOL
        for fn, arg in ((co.all_gather_matmul, xs[rank]), (co.matmul_reduce_scatter, As[rank])):
            try:
                fn(arg, ws[rank], co.Config(transport="p2p"))
            except RuntimeError as exc:
                assert "transport='p2p'" in str(exc) and "not on a GPU" in str(exc)
            else:
                raise AssertionError(f"{fn.__name__} ran transport='p2p' on CPU tensors")
        checks += 4

        # A transposed (non-contiguous) input and a caller's output buffer.
        xt = xs[rank].t().contiguous().t()
        out = torch.full((world * m, N), float("nan"))
        got = co.all_gather_matmul(xt, ws[rank], co.Config(chunks=4), out=out)
        assert got.data_ptr() == out.data_ptr() and torch.equal(out, co.all_gather_matmul(xs[rank], ws[rank], co.Config(chunks=4)))
        out_rs = torch.full((mo, N), float("nan"))
        co.matmul_reduce_scatter(As[rank], ws[rank], co.Config(chunks=2), out=out_rs)
        assert _rel(out_rs, truth_rs) <= FP32_REL_TOL
        checks += 2

        # The no-multicast variables reach every process started after the import.
        assert all(os.environ.get(k) == v for k, v in co.NO_MULTICAST_ENV.items())
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world": world, "checks": checks}))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_decomposed_equals_plain(world, tmp_path):
    # m=6 rows per rank (chunks 4 and 9 do not divide it, 9 > rows), reduce-scatter blocks of
    # 5 rows (chunks 2, 3, 4 do not divide them)
    results = run_ranks(world, _equivalence_worker, tmp_path, 6, 5, 16, 8)
    per_rank = 6 * 2 * 2 * 2 + 6 * 2 + 6 + 4 + 2
    assert [r["checks"] for r in results] == [per_rank] * world


def _validation_worker(rank, world, store, out_dir):
    _init(rank, world, store)
    caught = []
    try:
        x, w = torch.ones(4, 8), torch.ones(8, 3)

        def expect(exc, fn, *args, match="", **kw):
            try:
                fn(*args, **kw)
            except exc as e:
                assert match in str(e), (match, str(e))
                caught.append(type(e).__name__)
                return
            raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")

        expect(ValueError, co.matmul_reduce_scatter, torch.ones(5, 8), w, match="not divisible by the world size 2")
        expect(ValueError, co.matmul_reduce_scatter_reference, torch.ones(5, 8), w, match="not divisible")
        expect(ValueError, co.all_gather_matmul, x, torch.ones(7, 3), match="inner dimensions differ")
        expect(TypeError, co.all_gather_matmul, x, w.double(), match="share a dtype")
        expect(ValueError, co.all_gather_matmul, x, w, out=torch.empty(4, 3), match="out must be")
        expect(RuntimeError, co.all_gather_matmul, x, w, co.Config(use_symm_mem=True), match="CUDA")
        expect(RuntimeError, co.matmul_reduce_scatter, x, w, co.Config(use_symm_mem=True), match="CUDA")
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"caught": caught}))


def test_validation(tmp_path):
    results = run_ranks(2, _validation_worker, tmp_path)
    assert all(len(r["caught"]) == 7 for r in results)


def test_needs_an_initialised_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="not initialised"):
        co.all_gather_matmul(torch.ones(2, 2), torch.ones(2, 2))


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "rows, chunks, want",
    [
        (6, 4, [(0, 2), (2, 2), (4, 1), (5, 1)]),
        (8, 4, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        (3, 5, [(0, 1), (1, 1), (2, 1)]),
        (7, 1, [(0, 7)]),
    ],
)
def test_chunk_bounds(rows, chunks, want):
    assert co.chunk_bounds(rows, chunks) == want


def test_chunk_bounds_refuses_empty():
    with pytest.raises(ValueError):
        co.chunk_bounds(0, 2)


def test_config_validation_and_search_space():
    with pytest.raises(ValueError):
        co.Config(chunks=0)
    with pytest.raises(ValueError):
        co.Config(chunks=True)
    with pytest.raises(TypeError):
        co.Config(comm_stream=1)
    with pytest.raises(ValueError):
        co.Config(gemm="cutlass")
    for bad in ({"transport": "nvshmem"}, {"comm_ctas": -1}, {"sm_carveout": 1.5}, {"comm_ctas": True}):
        with pytest.raises(ValueError):
            co.Config(**bad)
    assert co.default_config(1) == co.Config(chunks=1)
    assert co.default_config(4096) == co.Config(chunks=2)
    space = co.search_space(4096)
    assert [(c.chunks, c.local_first, c.gemm) for c in space] == [(2, True, "bmm"), (4, True, "bmm"), (8, True, "bmm"),
                                                                  (4, False, "bmm"), (4, True, "mm")]
    assert not any(c.use_symm_mem or c.transport == "p2p" for c in space)
    symm = co.search_space(4096, symm_mem=True)
    assert symm[-1] == co.Config(use_symm_mem=True)
    assert [c.chunks for c in symm if c.transport == "p2p"] == [2, 4, 8]
    assert [c.chunks for c in co.search_space(3)] == [2, 3, 3]


def test_cpu_fallbacks_of_the_gpu_knobs():
    """On the CPU the SM knobs do nothing (no SMs to share) and the p2p transport refuses with
    a clear reason; capture_graph is CUDA only."""
    with co.sm_carveout(torch.device("cpu"), 8):
        pass
    with co.sm_carveout(torch.device("cuda"), 0):  # 0: nothing to set, on any device
        pass
    with pytest.raises(RuntimeError, match="transport='p2p'.*not on a GPU"):
        co._p2p_streams(torch.device("cpu"), "all_gather_matmul")
    assert co.free_symmetric_buffers() == 0  # none were made on the CPU


def test_no_multicast_environment(monkeypatch):
    # the import set them in this process (none of them was set to anything else here)
    for k, v in co.NO_MULTICAST_ENV.items():
        assert os.environ.get(k) == v
    env = {"NCCL_NVLS_ENABLE": "1"}
    unsafe = co.disable_multicast(env)
    assert unsafe == {"NCCL_NVLS_ENABLE": "1"}
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert not co.multicast_disabled(env)
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    ok, why = co.symm_mem_status(torch.device("cpu"))
    assert not ok and why.startswith("refused: NVLink multicast is not disabled") and "TORCH_SYMM_MEM_DISABLE_MULTICAST='0'" in why
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    ok, why = co.symm_mem_status(torch.device("cpu"))
    assert not ok and "CUDA" in why
