"""Compute/communication overlap for tensor-parallel GEMMs, decomposed into chunks.

What
    Tensor parallelism with sequence parallelism (Megatron-LM) puts a collective next to
    every linear layer, for any world size W (the tensor-parallel group):

    all-gather + GEMM (column-parallel layer; activations sharded by rows/tokens)
        rank r holds X_r (m, K) and its weight W_r (K, N);  Y_r = all_gather(X) @ W_r,
        (W*m, N): rows [q*m, (q+1)*m) of Y_r come from rank q's shard.
    GEMM + reduce-scatter (row-parallel layer)
        rank r holds A_r (M, K_r) and W_r (K_r, N);  Y_r = rows [r*M/W, (r+1)*M/W) of
        sum_q A_q @ W_q, (M/W, N).

    Run as written (the `*_reference` functions), the GPU first waits for the whole
    all-gather and then computes, or computes and then waits for the whole reduce-scatter:
    the links idle while the GEMM runs and the SMs idle while the links run. The trace
    shows this as exposed NCCL time (advisor's `exposed_comm` finding).

    Decomposition: cut each rank's rows into `chunks` pieces (sizes differ by at most one
    row, so any chunk count works; more chunks than rows means one row each).
    all_gather_matmul: chunk c's all-gather (rows [o_c, o_c + r_c) of every rank's shard)
        runs on a communication stream while the GEMM of chunk c-1 runs on the caller's
        stream; the GEMM of chunk c waits for chunk c's event only, never for the whole
        stream. With `local_first`, the GEMM of the rank's own shard (which needs no
        communication) runs first and hides chunk 0's all-gather; each chunk's GEMM then
        covers the other W-1 ranks' rows. One batched GEMM per rank range writes straight
        into the strided rows of Y (cuBLAS strided-batched, weights broadcast with batch
        stride 0: no copies); `gemm="mm"` runs one GEMM per rank block instead, every
        operand contiguous, should a batched GEMM be slower for a shape.
    matmul_reduce_scatter: chunk c's GEMM produces rows [o_c, o_c + r_c) of every rank's
        output block (a batched GEMM over a strided view of A, no copies) into a fresh
        partial buffer; chunk c's reduce-scatter then runs on the communication stream
        (after chunk c's event) while chunk c+1's GEMM computes. Only the last chunk's
        reduce-scatter stays exposed.

    Ordering is stream-to-stream only (torch.cuda.Stream, wait_stream, Event, wait_event),
    never a host synchronisation: the communication stream first waits for the caller's
    stream (inputs ready), a GEMM waits for its own chunk's event, and at the end the
    caller's stream waits for the communication stream, so the result is ready on the
    caller's stream like any other op's. NCCL collectives issued under the communication
    stream run on NCCL's internal stream ordered after it, and complete back onto it.
    Partial buffers read by a reduce-scatter are handed to the caching allocator with
    `record_stream`, so their memory is not reused before the collective has read it.

    With `use_symm_mem`, PyTorch's fused ops do the same job with symmetric memory
    (torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter: one chunk
    per rank, peer copies through NVLink P2P instead of NCCL kernels), when available and
    allowed (CUDA tensors, the ops exist in this torch, and NVLink multicast is disabled).

    On the CPU (gloo backend) there are no streams: collectives are synchronous, and the same
    decomposition runs in the same order, so the tests check the math of every chunking.

When it wins
    When the collective is a sizeable part of the step (>= a quarter) and the GEMM is large
    enough that cutting it into chunks keeps every chunk's GEMM efficient: long sequences
    (tokens >= 4096 per step) with a hidden size of 4096..8192. It cannot win when the
    collective is tiny (decomposition overhead: more, smaller kernels) or when the GEMM
    chunks fall below a wave of tiles. Time spent waiting for a slower rank is not hidden
    by any of this (advisor reports it as wait_ns).

Caveats
    - NCCL kernels occupy SMs (a few CTAs each) while the GEMM runs: a chunked GEMM can be a
      little slower than the whole one; measure (bench/bench_comm_overlap.py).
    - The last reduce-scatter chunk, and without `local_first` the first all-gather chunk,
      stay exposed: more chunks shrink them, at the price of smaller GEMMs.
    - Inputs must be the same shape on every rank; non-contiguous inputs are copied once
      (NCCL needs contiguous buffers). matmul_reduce_scatter needs M divisible by W.
    - NVLink multicast (NVLS, symmetric-memory multimem) is never used: importing this
      module sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
      NVSHMEM_DISABLE_NVLS=1 where unset, before any process group exists, and the
      symmetric-memory path refuses to run when they hold other values. On the shared
      multi-GPU machines this project runs on, a program that uses multicast can take the
      host's GPUs out of service for everyone; ring/tree NCCL and P2P copies are safe.
    - fp32 results are identical to the reference whenever the products and partial sums
      are exactly representable; otherwise the chunked GEMMs may sum in a different order
      (cuBLAS picks kernels by shape), within fp32 rounding.

Source of the idea
    Wang et al., "Overlap Communication with Dependent Computation via Decomposition in
    Large Deep Learning Models", ASPLOS 2023 (decompose the collective and its consumer or
    producer, schedule the pieces on separate streams); PyTorch async tensor parallelism
    (torch.distributed._symmetric_memory, TorchTitan's "Async TP", 2024: local shard first,
    then one peer shard per step); Flux (Chang et al., "FLUX: Fast Software-based
    Communication Overlap on GPUs through Kernel Fusion", arXiv 2406.06858, 2024), which
    goes further and fuses the communication into the GEMM's tiles. The GEMMs here are
    cuBLAS (torch.mm/bmm): the schedule is about the streams, and any GEMM of this folder
    can compute the chunks.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

# --------------------------------------------------------------------------------------------
# No NVLink multicast, in this process and every process it starts (children inherit the
# environment). Set at import because NCCL and PyTorch read these when a communicator or a
# symmetric-memory allocation is created: after that, changing them has no effect.
# --------------------------------------------------------------------------------------------

NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",  # NCCL: no NVLink SHARP (multicast) algorithms
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",  # PyTorch symmetric memory: no multicast objects
    "NVSHMEM_DISABLE_NVLS": "1",  # NVSHMEM (a symmetric-memory backend): no NVLS
}


def disable_multicast(environ=None) -> dict[str, str]:
    """Set the variables of NO_MULTICAST_ENV that are unset; return those that are set to
    another value (the caller decides whether to refuse to run)."""
    env = os.environ if environ is None else environ
    unsafe = {}
    for key, value in NO_MULTICAST_ENV.items():
        current = env.setdefault(key, value)
        if current != value:
            unsafe[key] = current
    return unsafe


def multicast_disabled(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return all(env.get(k) == v for k, v in NO_MULTICAST_ENV.items())


disable_multicast()


# --------------------------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Every knob of the overlapped schedules."""

    chunks: int = 4  # pieces of each rank's rows; clamped to the row count
    comm_stream: bool = True  # collectives on a side stream (False: same chunks, serialized: the ablation)
    local_first: bool = True  # all-gather + GEMM: GEMM the own shard first, hiding chunk 0's gather
    use_symm_mem: bool = False  # torch.ops.symm_mem fused ops instead of the NCCL decomposition
    gemm: str = "bmm"  # "bmm": one batched GEMM per chunk over the ranks' row blocks (strided
    #                    views, weights broadcast with batch stride 0); "mm": one GEMM per rank
    #                    block, every operand and output contiguous (more launches, no layout risk)

    def __post_init__(self):
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or self.chunks < 1:
            raise ValueError(f"chunks must be a positive integer, got {self.chunks!r}")
        for name in ("comm_stream", "local_first", "use_symm_mem"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.gemm not in ("bmm", "mm"):
            raise ValueError(f"gemm must be 'bmm' or 'mm', got {self.gemm!r}")


def default_config(rows: int) -> Config:
    """Four chunks (rows permitting): on an H200, chunks of >= 512 rows keep cuBLAS near its
    full-size throughput, and the exposed remainder is a quarter of one collective at most."""
    return Config(chunks=max(1, min(4, rows)))


def search_space(rows: int, symm_mem: bool = False) -> list[Config]:
    """Candidates for the benchmark: chunk counts 2/4/8 (rows permitting), the ablations, and
    the symmetric-memory fused op when it may be used."""
    out = []
    for c in (2, 4, 8):
        if c <= rows:
            out.append(Config(chunks=c))
    out.append(Config(chunks=min(4, rows), local_first=False))
    out.append(Config(chunks=min(4, rows), gemm="mm"))
    if symm_mem:
        out.append(Config(use_symm_mem=True))
    return out


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """(offset, size) of `chunks` row ranges covering [0, rows), sizes differing by at most
    one (the first `rows % chunks` get the extra row); at most `rows` chunks."""
    if rows < 1:
        raise ValueError(f"nothing to split: {rows} rows")
    n = max(1, min(int(chunks), rows))
    base, extra = divmod(rows, n)
    out, o = [], 0
    for i in range(n):
        r = base + (1 if i < extra else 0)
        out.append((o, r))
        o += r
    return out


# --------------------------------------------------------------------------------------------
# Plumbing: groups, collectives across torch versions, streams, symmetric memory
# --------------------------------------------------------------------------------------------

# torch >= 2.13 names them *_single; older versions only have *_into_tensor / *_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call init_process_group first (or launch with torchrun)")
    g = group if group is not None else dist.group.WORLD
    return g, dist.get_world_size(g), dist.get_rank(g)


def _check(a: torch.Tensor, b: torch.Tensor, what: str) -> tuple[int, int, int]:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{what}: inputs must be torch tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{what}: inputs must be 2-D, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{what}: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{what}: inputs must share a dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{what}: inputs are on different devices ({a.device}, {b.device})")
    if min(a.shape[0], a.shape[1], b.shape[1]) < 1:
        raise ValueError(f"{what}: empty problem {tuple(a.shape)} @ {tuple(b.shape)}")
    return a.shape[0], b.shape[1], a.shape[1]


def _output(out, shape, like: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.device != like.device:
        got = (tuple(out.shape), out.dtype, out.device) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out must be a contiguous {tuple(shape)} {like.dtype} tensor on {like.device}, got {got}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous (collectives write it in place)")
    return out


_COMM_STREAMS: dict[int, torch.cuda.Stream] = {}


def _streams(device: torch.device, side: bool):
    """(caller's stream, communication stream); (None, None) on the CPU. With side=False the
    communication stream is the caller's: same chunks, no overlap."""
    if device.type != "cuda":
        return None, None
    cur = torch.cuda.current_stream(device)
    if not side:
        return cur, cur
    idx = device.index if device.index is not None else torch.cuda.current_device()
    s = _COMM_STREAMS.get(idx)
    if s is None:
        s = _COMM_STREAMS[idx] = torch.cuda.Stream(device=device)
    return cur, s


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def symm_mem_status(device: torch.device, group=None) -> tuple[bool, str]:
    """(usable, reason): may the symmetric-memory fused ops run here?"""
    if not multicast_disabled():
        bad = ", ".join(f"{k}={os.environ.get(k)!r}" for k in NO_MULTICAST_ENV if os.environ.get(k) != NO_MULTICAST_ENV[k])
        return False, f"refused: NVLink multicast is not disabled ({bad})"
    if torch.device(device).type != "cuda":
        return False, "symmetric memory needs CUDA tensors"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")  # registers torch.ops.symm_mem
    except ImportError as exc:
        return False, f"torch.distributed._symmetric_memory is not available ({exc})"
    ops = getattr(torch.ops, "symm_mem", None)
    if ops is None or not hasattr(ops, "fused_all_gather_matmul") or not hasattr(ops, "fused_matmul_reduce_scatter"):
        return False, f"torch {torch.__version__} has no symm_mem fused all-gather/reduce-scatter matmul"
    if dist.is_initialized() and dist.get_backend(group) != "nccl":
        return False, f"symmetric memory runs with the nccl backend, not {dist.get_backend(group)}"
    return True, "available"


def _symm_group_name(group, device) -> str:
    ok, why = symm_mem_status(device, group)
    if not ok:
        raise RuntimeError(f"use_symm_mem=True but {why}")
    from torch.distributed import _symmetric_memory as symm

    name = group.group_name
    enable = getattr(symm, "enable_symm_mem_for_group", None)  # needed before torch 2.12, deprecated since
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)
    return name


# --------------------------------------------------------------------------------------------
# all-gather + GEMM
# --------------------------------------------------------------------------------------------


def all_gather_matmul_reference(x: torch.Tensor, w: torch.Tensor, *, group=None) -> torch.Tensor:
    """Unoverlapped: gather every rank's rows, then one GEMM. (W*m, N)."""
    g, world, _ = _group(group)
    m, N, K = _check(x, w, "all_gather_matmul")
    x = x.contiguous()
    full = torch.empty((world * m, K), dtype=x.dtype, device=x.device)
    _all_gather(full, x, group=g)
    return torch.mm(full, w)


def all_gather_matmul(x: torch.Tensor, w: torch.Tensor, config: Config | None = None, *, group=None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """all_gather(x) @ w with chunk c+1's all-gather overlapping chunk c's GEMM.

    x: (m, K), this rank's rows (the same m on every rank); w: (K, N). Returns (W*m, N) in
    x's dtype, rank-major rows (as the reference), in `out` when given."""
    g, world, rank = _group(group)
    m, N, K = _check(x, w, "all_gather_matmul")
    config = config or default_config(m)
    y = _output(out, (world * m, N), x)
    if config.use_symm_mem:
        name = _symm_group_name(g, x.device)
        _, outs = torch.ops.symm_mem.fused_all_gather_matmul(x.contiguous(), [w], 0, name)
        return y.copy_(outs[0]) if out is not None else outs[0]
    x = x.contiguous()
    y3 = y.view(world, m, N)
    bounds = chunk_bounds(m, config.chunks)
    bufs = [torch.empty((world * r, K), dtype=x.dtype, device=x.device) for _, r in bounds]
    cur, comm = _streams(x.device, config.comm_stream)
    side = comm is not None and comm is not cur
    if side:
        comm.wait_stream(cur)  # x, w and the fresh buffers are ready before the side stream reads them
    events = []
    for (o, r), buf in zip(bounds, bufs):
        with _on(comm):
            _all_gather(buf, x[o:o + r], group=g)
            events.append(comm.record_event() if side else None)
    if config.local_first:  # own rows need no communication: compute them while chunk 0 arrives
        torch.mm(x, w, out=y[rank * m:(rank + 1) * m])
    for (o, r), buf, ev in zip(bounds, bufs, events):
        if ev is not None:
            cur.wait_event(ev)
        b3 = buf.view(world, r, K)
        spans = ((0, rank), (rank + 1, world)) if config.local_first else ((0, world),)
        for lo, hi in spans:
            if hi <= lo:
                continue
            if config.gemm == "bmm":
                torch.bmm(b3[lo:hi], w.expand(hi - lo, K, N), out=y3[lo:hi, o:o + r])
            else:
                for q in range(lo, hi):  # rows o..o+r of rank q's block: contiguous in y
                    torch.mm(b3[q], w, out=y[q * m + o:q * m + o + r])
    return y


# --------------------------------------------------------------------------------------------
# GEMM + reduce-scatter
# --------------------------------------------------------------------------------------------


def matmul_reduce_scatter_reference(a: torch.Tensor, w: torch.Tensor, *, group=None) -> torch.Tensor:
    """Unoverlapped: one GEMM, then reduce-scatter its rows. (M/W, N)."""
    g, world, _ = _group(group)
    M, N, _ = _check(a, w, "matmul_reduce_scatter")
    if M % world:
        raise ValueError(f"matmul_reduce_scatter: M={M} is not divisible by the world size {world}")
    partial = torch.mm(a, w)
    y = torch.empty((M // world, N), dtype=a.dtype, device=a.device)
    _reduce_scatter(y, partial, group=g)
    return y


def matmul_reduce_scatter(a: torch.Tensor, w: torch.Tensor, config: Config | None = None, *, group=None,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """reduce_scatter(a @ w) with chunk c's reduce-scatter overlapping chunk c+1's GEMM.

    a: (M, K_r), w: (K_r, N), M divisible by the world size W. Returns this rank's (M/W, N)
    block of the sum over ranks, in `out` when given."""
    g, world, _ = _group(group)
    M, N, K = _check(a, w, "matmul_reduce_scatter")
    if M % world:
        raise ValueError(f"matmul_reduce_scatter: M={M} is not divisible by the world size {world}")
    mo = M // world
    config = config or default_config(mo)
    y = _output(out, (mo, N), a)
    if config.use_symm_mem:
        name = _symm_group_name(g, a.device)
        res = torch.ops.symm_mem.fused_matmul_reduce_scatter(a.contiguous(), w, "sum", 0, name)
        return y.copy_(res) if out is not None else res
    a3 = a.contiguous().view(world, mo, K)
    cur, comm = _streams(a.device, config.comm_stream)
    side = comm is not None and comm is not cur
    if side:
        comm.wait_stream(cur)  # y is ready before the side stream writes it
    for o, r in chunk_bounds(mo, config.chunks):
        part = torch.empty((world, r, N), dtype=a.dtype, device=a.device)
        if config.gemm == "bmm":  # rows o..o+r of every rank's block, one batched GEMM
            torch.bmm(a3[:, o:o + r], w.expand(world, K, N), out=part)
        else:
            for q in range(world):
                torch.mm(a3[q, o:o + r], w, out=part[q])
        ev = cur.record_event() if side else None
        with _on(comm):
            if ev is not None:
                comm.wait_event(ev)
            _reduce_scatter(y[o:o + r], part.view(world * r, N), group=g)
        if side:
            part.record_stream(comm)  # freed below while the collective may still read it
    if side:
        cur.wait_stream(comm)  # the result is ready on the caller's stream
    return y


# --------------------------------------------------------------------------------------------
# Self-check: `python -m kernels.comm_overlap` (CPU, gloo, 2..4 processes) or
# `torchrun --nproc-per-node N -m kernels.comm_overlap` (GPUs: nccl)
# --------------------------------------------------------------------------------------------


def check_rank(rows: int = 6, K: int = 16, N: int = 8, dtype=torch.float32, device=None, group=None) -> list[str]:
    """On every rank of an initialised group: each schedule and chunking against the
    reference. Integer-valued inputs make every product and partial sum exact in fp32, so
    any summation order gives the same bits: results must be identical. Returns one line per
    check (raises AssertionError on a mismatch)."""
    g, world, rank = _group(group)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() and dist.get_backend(g) == "nccl" else "cpu"))
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randint(-4, 5, (rows, K), generator=gen).to(dtype).to(device)
    w = torch.randint(-4, 5, (K, N), generator=gen).to(dtype).to(device)
    a = torch.randint(-4, 5, (rows * world, K), generator=gen).to(dtype).to(device)
    lines = []
    ref_ag = all_gather_matmul_reference(x, w, group=g)
    ref_rs = matmul_reduce_scatter_reference(a, w, group=g)
    for chunks in sorted({1, 2, 3, 4, rows, rows + 1}):
        for gemm in ("bmm", "mm"):
            for local_first in (True, False):
                cfg = Config(chunks=chunks, local_first=local_first, gemm=gemm)
                got = all_gather_matmul(x, w, cfg, group=g)
                assert torch.equal(got, ref_ag), f"rank {rank}: all_gather_matmul {cfg} differs from the reference"
            got = matmul_reduce_scatter(a, w, Config(chunks=chunks, gemm=gemm), group=g)
            assert torch.equal(got, ref_rs), f"rank {rank}: matmul_reduce_scatter chunks={chunks} gemm={gemm} differs"
        lines.append(f"rank {rank}/{world}: chunks={chunks} ok")
    return lines


def _self_check_worker(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for line in check_rank():
            if rank == 0:
                print(line)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import tempfile

    if "RANK" in os.environ:  # launched by torchrun
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        try:
            for line in check_rank(dtype=torch.float32):
                print(line)
        finally:
            dist.destroy_process_group()
    else:
        import torch.multiprocessing as mp

        for world in (2, 3, 4):
            with tempfile.TemporaryDirectory() as tmp:
                mp.start_processes(_self_check_worker, args=(world, os.path.join(tmp, "store")), nprocs=world,
                                   start_method="fork")
