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

    Transports (`transport`): "nccl" runs each chunk's collective as a NCCL kernel on the
    communication stream. That kernel holds SMs (a few dozen CTAs for the ring) while the
    chunk GEMMs run, and cuBLAS's persistent GEMMs, sized to every SM, then run a second
    partial wave: chunk GEMMs ran about twice as slow beside the NCCL kernel
    (capping NCCL at 16 CTAs, `comm_ctas`, or leaving SMs free with `sm_carveout` did not
    recover it). "p2p" moves the bytes with copy-engine copies from the peers' symmetric-
    memory buffers over NVLink (cudaMemcpy: no SMs), ordered across GPUs by barrier kernels
    of torch's symmetric memory: all_gather_matmul publishes the own rows, barriers once,
    then copies every chunk of every peer while the GEMMs run; matmul_reduce_scatter
    computes the partials for the other ranks' blocks first (a barrier kernel between two
    GEMMs marks each chunk written), copies the peers' partials of its own block while the
    next chunk computes, and runs its own block's GEMM last as `A_own @ W + received` (cuBLAS
    adds the received partials in its epilogue), which hides the last chunk's copy. Needs
    CUDA, symmetric memory and NVLink multicast off (symm_mem_status); its buffers are made
    once per shape and kept (free_symmetric_buffers() drops them). Measured on 2 GPUs only.

    Host cost: a chunked schedule issues several ops and collectives per chunk. Where the
    host is slower than the GPU (measured: the lent 2-GPU machine), every op waits for its
    launch and nothing overlaps; capture the step once with capture_graph() (a CUDA graph:
    NCCL collectives, copies, barriers and side streams included) and replay it.

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
    On two GPUs over NVLink, transport="p2p" with 2 chunks beat the unoverlapped sequence on
    every shape where communication is a quarter of the step or more, the NCCL transport by
    less; replayed eagerly on a slow host most shapes lose, so graph-capture the step
    (docs/schedules/comm_overlap.md).

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

    chunks: int = 2  # pieces of each rank's rows; clamped to the row count
    comm_stream: bool = True  # collectives on a side stream (False: same chunks, serialized: the ablation)
    local_first: bool = True  # all-gather + GEMM: GEMM the own shard first, hiding chunk 0's gather
    use_symm_mem: bool = False  # torch.ops.symm_mem fused ops instead of the NCCL decomposition
    gemm: str = "bmm"  # "bmm": one batched GEMM per chunk over the ranks' row blocks (strided
    #                    views, weights broadcast with batch stride 0); "mm": one GEMM per rank
    #                    block, every operand and output contiguous (more launches, no layout risk)
    comm_ctas: int = 0  # NCCL: at most this many CTAs (SMs) per collective, leaving the rest to
    #                     the concurrent GEMM (a second communicator over the same ranks); 0: NCCL's choice
    transport: str = "nccl"  # "nccl": chunked NCCL collectives (kernels: they take SMs from the
    #                          GEMM); "p2p": copy-engine copies from the peers' symmetric-memory
    #                          buffers over NVLink (no SMs for the transfer; CUDA + symm_mem only)
    sm_carveout: int = 0  # SMs the chunked GEMMs leave free for the concurrent collective (cuBLAS
    #                       SM count target): a GEMM sized to every SM otherwise runs the tiles of
    #                       the SMs the collective holds in a second wave; 0: the GEMM takes all SMs

    def __post_init__(self):
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or self.chunks < 1:
            raise ValueError(f"chunks must be a positive integer, got {self.chunks!r}")
        for name in ("comm_stream", "local_first", "use_symm_mem"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.gemm not in ("bmm", "mm"):
            raise ValueError(f"gemm must be 'bmm' or 'mm', got {self.gemm!r}")
        if self.transport not in ("nccl", "p2p"):
            raise ValueError(f"transport must be 'nccl' or 'p2p', got {self.transport!r}")
        for name in ("comm_ctas", "sm_carveout"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")


def default_config(rows: int) -> Config:
    """Two chunks (rows permitting), NCCL transport (it runs anywhere, gloo included): 2 chunks
    were fastest in 11 of the 12 comm-heavy suite rows on two sm_90 GPUs (p2p, graphed), each chunk
    costing a signal and smaller GEMMs. On NVLink GPUs, transport="p2p" is the faster one."""
    return Config(chunks=max(1, min(2, rows)))


def search_space(rows: int, symm_mem: bool = False) -> list[Config]:
    """Candidates for the benchmark: chunk counts 2/4/8 (rows permitting), the ablations, and
    where symmetric memory may be used, the p2p transport at each chunk count and the
    symmetric-memory fused op."""
    out = []
    counts = [c for c in (2, 4, 8) if c <= rows]
    for c in counts:
        out.append(Config(chunks=c))
    out.append(Config(chunks=min(4, rows), local_first=False))
    out.append(Config(chunks=min(4, rows), gemm="mm"))
    if symm_mem:
        out += [Config(chunks=c, transport="p2p") for c in counts]
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


_CTA_GROUPS: dict[tuple, object] = {}


def comm_group(group, max_ctas: int):
    """The group to run the chunked collectives on: `group` itself, or (max_ctas > 0, NCCL) a
    second communicator over the same ranks whose collectives use at most `max_ctas` CTAs.

    Why: a NCCL collective running next to a GEMM takes SMs from it (up to one CTA per
    channel), and a persistent GEMM sized to every SM then runs part of its tiles in a second
    wave. Capping the collective's CTAs trades link bandwidth for GEMM throughput.
    Creating it is collective (every rank of `group` calls this in the same order, as the
    SPMD schedules do); it is made once per (group, max_ctas) and cached."""
    if not max_ctas or dist.get_backend(group) != "nccl":
        return group  # gloo has no CTAs to cap
    key = (group.group_name, int(max_ctas))
    g = _CTA_GROUPS.get(key)
    if g is None:
        opts = dist.ProcessGroupNCCL.Options()
        opts.config.max_ctas = int(max_ctas)
        opts.config.min_ctas = 1
        g = _CTA_GROUPS[key] = dist.new_group(dist.get_process_group_ranks(group), backend="nccl", pg_options=opts)
    return g


@contextlib.contextmanager
def sm_carveout(device: torch.device, sms: int):
    """cuBLAS GEMMs issued inside leave `sms` SMs unused (PyTorch's SM carveout, which sets
    cuBLAS's SM count target), so that a collective running beside them keeps its SMs
    without pushing part of the GEMM into a second wave. No-op for sms=0 or on the CPU.
    Under CUDA-graph capture the choice is baked into the captured kernels."""
    if not sms or torch.device(device).type != "cuda":
        yield
        return
    get = getattr(torch._C, "_get_sm_carveout_experimental", None)
    put = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if get is None or put is None:
        raise RuntimeError(f"sm_carveout={sms} needs torch._C._set_sm_carveout_experimental "
                           f"(not in torch {torch.__version__}); use sm_carveout=0")
    before = get()
    put(int(sms))
    try:
        yield
    finally:
        put(before)


def capture_graph(fn, *, warmup: int = 2):
    """Capture `fn()` (every stream it forks, NCCL collectives included) into a CUDA graph.

    Returns (replay, out): `replay()` re-runs the captured work on the current stream with
    no per-op host cost, and `out` is the tensor fn returned at capture, which each replay
    rewrites in place. Why: a chunked schedule issues several ops and collectives per chunk;
    on a slow host the GPU then waits for the launches and nothing overlaps (advisor flags
    this as gpu_idle). Inputs must stay where they are (graphs read fixed addresses).
    The warm-up runs first on a side stream (NCCL communicators, cuBLAS handles and
    workspaces exist before capture, as CUDA graphs require)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


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


_SYMM_BUFFERS: dict[tuple, tuple] = {}


def _symm_buffer(tag: str, shape, dtype, device, group):
    """(tensor, handle): a symmetric-memory buffer of `shape` on every rank of `group`, made
    once per (tag, shape, dtype, device, group) and kept (rendezvous is collective and slow;
    CUDA-graph capture needs it to exist before capture)."""
    device = torch.device(device)
    key = (tag, tuple(shape), dtype, device.index, group.group_name)
    hit = _SYMM_BUFFERS.get(key)
    if hit is None:
        _symm_group_name(group, device)  # refuses when symmetric memory may not be used here
        from torch.distributed import _symmetric_memory as symm

        t = symm.empty(tuple(shape), dtype=dtype, device=device)
        hit = _SYMM_BUFFERS[key] = (t, symm.rendezvous(t, group))
    return hit


def free_symmetric_buffers() -> int:
    """Drop the cached symmetric-memory buffers of the p2p transport (one per pattern, shape
    and dtype, kept for reuse and CUDA-graph capture); returns how many. Call it on every rank
    once no schedule and no captured graph will use them again."""
    n = len(_SYMM_BUFFERS)
    _SYMM_BUFFERS.clear()
    return n


def _p2p_streams(device, what: str):
    """(caller's stream, communication stream) for the p2p transport, which always copies on
    the side stream (comm_stream=False is the NCCL transport's serial ablation)."""
    if torch.device(device).type != "cuda":
        raise RuntimeError(f"{what}: transport='p2p' copies between GPUs through symmetric memory; "
                           "these tensors are not on a GPU (use transport='nccl')")
    cur, comm = _streams(torch.device(device), True)
    return cur, comm


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
    bounds = chunk_bounds(m, config.chunks)
    if config.transport == "p2p":
        views, events, cur = _gather_p2p(x, bounds, g, world, rank, config.local_first)
        with sm_carveout(x.device, config.sm_carveout):
            _gather_gemms(x, w, y, views, bounds, events, cur, config, world, rank)
        cur.wait_stream(_streams(x.device, True)[1])  # the closing barrier: peers are done reading
        return y
    cg = comm_group(g, config.comm_ctas)
    bufs = [torch.empty((world * r, K), dtype=x.dtype, device=x.device) for _, r in bounds]
    cur, comm = _streams(x.device, config.comm_stream)
    side = comm is not None and comm is not cur
    if side:
        comm.wait_stream(cur)  # x, w and the fresh buffers are ready before the side stream reads them
    events = []
    for (o, r), buf in zip(bounds, bufs):
        with _on(comm):
            _all_gather(buf, x[o:o + r], group=cg)
            events.append(comm.record_event() if side else None)
    views = [buf.view(world, r, K) for buf, (_, r) in zip(bufs, bounds)]
    with sm_carveout(x.device, config.sm_carveout):
        _gather_gemms(x, w, y, views, bounds, events, cur, config, world, rank)
    return y


def _gather_p2p(x, bounds, g, world, rank, local_first):
    """Chunked all-gather by copy engine: every rank publishes its rows in a symmetric buffer;
    on the communication stream, after a barrier (all published), chunk c's rows of every
    peer are copied (cudaMemcpy over NVLink: no SMs) into a gathered buffer and an event marks
    the chunk (and the own rows too, unless local_first computes them from x); a closing
    barrier (all peers done reading) guards the buffer's next use.
    Returns ((world, r, K) views per chunk, events, caller's stream)."""
    m, K = x.shape
    cur, comm = _p2p_streams(x.device, "all_gather_matmul")
    shard, h = _symm_buffer("all_gather", (m, K), x.dtype, x.device, g)
    full = torch.empty((world, m, K), dtype=x.dtype, device=x.device)
    shard.copy_(x)  # publish (caller's stream: ordered after x is ready)
    comm.wait_stream(cur)
    events = []
    with torch.cuda.stream(comm):
        h.barrier(channel=0)
        peers = {q: h.get_buffer(q, (m, K), x.dtype) for q in range(world) if q != rank}
        for o, r in bounds:
            for step in range(1 if local_first else 0, world):  # from the next rank on: peers
                q = (rank + step) % world                           # do not all read one rank
                full[q, o:o + r].copy_(x[o:o + r] if q == rank else peers[q][o:o + r])
            events.append(comm.record_event())
        h.barrier(channel=1)
    full.record_stream(comm)
    return [full[:, o:o + r] for o, r in bounds], events, cur


def _gather_gemms(x, w, y, views, bounds, events, cur, config, world, rank):
    """all_gather_matmul's GEMMs on the caller's stream, each after its chunk's event; views[c]
    is chunk c's gathered rows as (world, r, K)."""
    m, K = x.shape
    N = w.shape[1]
    y3 = y.view(world, m, N)
    if config.local_first:  # own rows need no communication: compute them while chunk 0 arrives
        torch.mm(x, w, out=y[rank * m:(rank + 1) * m])
    for (o, r), b3, ev in zip(bounds, views, events):
        if ev is not None:
            cur.wait_event(ev)
        spans = ((0, rank), (rank + 1, world)) if config.local_first else ((0, world),)
        for lo, hi in spans:
            if hi <= lo:
                continue
            if config.gemm == "bmm":
                torch.bmm(b3[lo:hi], w.expand(hi - lo, K, N), out=y3[lo:hi, o:o + r])
            else:
                for q in range(lo, hi):  # rows o..o+r of rank q's block: contiguous in y
                    torch.mm(b3[q], w, out=y[q * m + o:q * m + o + r])


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
    g, world, rank = _group(group)
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
    if config.transport == "p2p":
        return _matmul_reduce_scatter_p2p(a3, w, y, config, g, world, rank)
    cg = comm_group(g, config.comm_ctas)
    cur, comm = _streams(a.device, config.comm_stream)
    side = comm is not None and comm is not cur
    if side:
        comm.wait_stream(cur)  # y is ready before the side stream writes it
    for o, r in chunk_bounds(mo, config.chunks):
        part = torch.empty((world, r, N), dtype=a.dtype, device=a.device)
        with sm_carveout(a.device, config.sm_carveout):
            if config.gemm == "bmm":  # rows o..o+r of every rank's block, one batched GEMM
                torch.bmm(a3[:, o:o + r], w.expand(world, K, N), out=part)
            else:
                for q in range(world):
                    torch.mm(a3[q, o:o + r], w, out=part[q])
        ev = cur.record_event() if side else None
        with _on(comm):
            if ev is not None:
                comm.wait_event(ev)
            _reduce_scatter(y[o:o + r], part.view(world * r, N), group=cg)
        if side:
            part.record_stream(comm)  # freed below while the collective may still read it
    if side:
        cur.wait_stream(comm)  # the result is ready on the caller's stream
    return y


def _matmul_reduce_scatter_p2p(a3, w, y, config, g, world, rank):
    """Chunked reduce-scatter by copy engine, own block last.

    Chunk c's GEMM computes this rank's partial rows [o, o+r) of every *other* rank's block
    into a symmetric buffer, then a barrier kernel on the caller's stream (between two GEMMs,
    so it finds a free SM) marks every rank's chunk c as written. The communication stream
    copies the peers' partials of this rank's block for chunk c (cudaMemcpy over NVLink: no
    SMs) while the next chunk computes. The own block's GEMM needs no communication and runs
    last, chunk by chunk, as `y = A_own @ W + (sum of the peers' partials)` (cuBLAS adds the
    received partials in its epilogue, beta=1): it hides the last chunk's copy. On two sm_90 GPUs
    the result was bit-identical to the NCCL reduce-scatter of the unoverlapped sequence.
    A closing barrier (every rank's copies done) guards the buffer's next use."""
    _, mo, K = a3.shape
    N = w.shape[1]
    cur, comm = _p2p_streams(a3.device, "matmul_reduce_scatter")
    part, h = _symm_buffer("reduce_scatter", (world, mo, N), a3.dtype, a3.device, g)
    peers = [(rank + step) % world for step in range(1, world)]  # from the next rank on
    bufs = {q: h.get_buffer(q, (world, mo, N), a3.dtype) for q in peers}
    recv = torch.empty((world - 1, mo, N), dtype=a3.dtype, device=a3.device)
    comm.wait_stream(cur)  # recv exists before the communication stream writes it
    spans = [(lo, hi) for lo, hi in ((0, rank), (rank + 1, world)) if hi > lo]
    bounds = chunk_bounds(mo, config.chunks)
    copied = []
    with sm_carveout(a3.device, config.sm_carveout):
        for o, r in bounds:
            for lo, hi in spans:  # partials for the other ranks' blocks
                if config.gemm == "bmm":
                    torch.bmm(a3[lo:hi, o:o + r], w.expand(hi - lo, K, N), out=part[lo:hi, o:o + r])
                else:
                    for q in range(lo, hi):
                        torch.mm(a3[q, o:o + r], w, out=part[q, o:o + r])
            h.barrier(channel=0)  # every rank's chunk c partials are written
            ev = cur.record_event()
            with torch.cuda.stream(comm):
                comm.wait_event(ev)
                for i, q in enumerate(peers):
                    recv[i, o:o + r].copy_(bufs[q][rank, o:o + r])
                copied.append(comm.record_event())
        for (o, r), ev in zip(bounds, copied):  # own block last: y = A_own @ W + received
            cur.wait_event(ev)
            acc = recv[0, o:o + r] if world == 2 else torch.sum(recv[:, o:o + r], dim=0)
            torch.addmm(acc, a3[rank, o:o + r], w, out=y[o:o + r])
    h.barrier(channel=1)  # every rank has copied its partials: the buffer may be rewritten
    recv.record_stream(comm)
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
