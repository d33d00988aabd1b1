"""Host-side helpers shared by every GEMM schedule in this folder.

Kept small on purpose: each schedule file reads as a standalone story (docstring, config,
`@triton.jit` kernel, launcher, search space, self-check) and only borrows the dull parts
from here: input validation, tolerances, poisoning, SM count, launch metadata.

Run a schedule's self-check from the repository root as `python -m kernels.<name>`; on a
machine without a GPU, `TRITON_INTERPRET=1 python -m kernels.<name>` runs it on the CPU.
"""

from __future__ import annotations

import functools
import math
import os

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Relative Frobenius error ||out - ref|| / ||ref|| against a float64 reference, per input dtype.
# Accumulation is fp32 in every schedule, so the error is dominated by rounding the output
# (and, for fp32 inputs on tensor cores, by tf32 rounding of the operands):
TOLERANCE = {
    # fp16 output rounding: unit roundoff 2^-11 = 4.9e-4, rms ~ u/sqrt(3) = 2.8e-4; 4x margin
    # leaves room for fp32 accumulation-order differences over K up to 128k.
    torch.float16: 2e-3,
    # bf16 output rounding: u = 2^-8 = 3.9e-3, rms ~ 2.3e-3; 4x margin as above.
    torch.bfloat16: 1e-2,
    # fp32 inputs run as tf32 on tensor cores (10-bit mantissa, u = 2^-11 per operand, ~4e-4
    # rms per product); METHOD.md measured tf32 GEMMs near 3e-4. Under the CPU interpreter the
    # math is plain fp32 and lands near 1e-7.
    torch.float32: 2e-3,
}


def check_matmul_inputs(a: torch.Tensor, b: torch.Tensor, where: str = "") -> tuple[int, int, int]:
    """Validate a (M, K) @ b (K, N) and return (M, N, K). Raises ValueError/TypeError, the
    message prefixed with `where` (grouped_gemm names the group: "group 3: ")."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{where}a and b must be torch tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{where}a and b must be 2-D, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{where}inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{where}a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{where}dtype {a.dtype} not supported (fp16, bf16, fp32)")
    if a.device != b.device:
        raise ValueError(f"{where}a and b are on different devices ({a.device}, {b.device})")
    if not a.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{where}tensors must be on a CUDA device (or set TRITON_INTERPRET=1 for the CPU interpreter)")
    M, K = a.shape
    N = b.shape[1]
    if min(M, N, K) < 1:
        raise ValueError(f"{where}empty problem: M={M}, N={N}, K={K}")
    return M, N, K


def num_sms(device: torch.device | str | None = None) -> int:
    """Streaming multiprocessors of the device; ADVISOR_NUM_SMS overrides (the CPU
    interpreter has no device, so tests set a small number there)."""
    env = os.environ.get("ADVISOR_NUM_SMS")
    if env:
        return max(1, int(env))
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        index = torch.device(device).index if device is not None else None
        return _cuda_sms(torch.cuda.current_device() if index is None else index)
    return 4


@functools.cache
def _cuda_sms(index: int) -> int:
    # device properties cost microseconds a query; every launcher asks on every call
    return torch.cuda.get_device_properties(index).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def aligned_empty(rows: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A (rows, cols) row-major view of a buffer whose row stride is padded to 16 bytes (TMA's
    rule): where the TMA schedules stage operands and outputs that break it."""
    per = 16 // dtype.itemsize
    return torch.empty((rows, cdiv(cols, per) * per), dtype=dtype, device=device)[:, :cols]


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that any element a kernel forgets to write fails the check."""
    return t.fill_(float("nan"))


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64; inf when `out` holds NaN/inf."""
    o = out.detach().to(torch.float64).cpu()
    r = ref.detach().to(torch.float64).cpu()
    if not torch.isfinite(o).all():
        return math.inf
    denom = torch.linalg.norm(r).item()
    return torch.linalg.norm(o - r).item() / (denom if denom > 0 else 1.0)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 product on the CPU: the truth every schedule is checked against."""
    return a.detach().to(torch.float64).cpu() @ b.detach().to(torch.float64).cpu()


def gemm_launch_metadata(schedule: str):
    """A Triton `launch_metadata` hook naming the schedule and shape, with flops and bytes, so
    profiles of our own kernels are diagnosable (the persistent-matmul tutorial's habit)."""

    def hook(grid, kernel, args):
        M, N, K = args["M"], args["N"], args["K"]
        a = args.get("a_ptr")
        a = getattr(a, "base", a)  # a host TensorDescriptor carries its tensor as .base
        elt = a.element_size() if hasattr(a, "element_size") else 2
        return {
            "name": f"{schedule} [M={M}, N={N}, K={K}]",
            "flops": 2.0 * M * N * K,
            "bytes": elt * (M * K + K * N + M * N),
        }

    return hook


def fix_interpreter_bf16_dot() -> None:
    """Make the CPU interpreter's `tl.dot` correct for bfloat16 operands.

    Triton 3.6's interpreter stores bf16 as raw uint16 and its `create_dot` multiplies those
    bit patterns (triton-lang/triton#11584, closed upstream as "not supported yet"), so
    every bf16 GEMM is garbage under TRITON_INTERPRET=1 while fp16/fp32 are exact. Widening
    bf16 to fp32 is exact, so this patch only makes the emulation match the GPU's math.
    Idempotent; a no-op when the interpreter is not in use."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_bf16_widened", False):
        return
    original = builder.create_dot

    def widen(h):
        if h.dtype.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(h.data).astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_widened = True
    builder.create_dot = create_dot


def fix_interpreter_descriptor_reduce() -> None:
    """Give the CPU interpreter the TMA reductions (`tensor_descriptor.atomic_add`).

    Triton 3.6's interpreter builds `descriptor_load` and `descriptor_store` but has no
    `create_descriptor_reduce`, so a kernel that reduce-adds a block through a tensor
    descriptor cannot run under TRITON_INTERPRET=1. This adds it as what the hardware does:
    an element-wise atomic add of the block into the descriptor's box, clipped at the
    tensor's bounds like the TMA. Only ADD is provided (the one our kernels use).
    Idempotent; a no-op when the interpreter is not in use."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if hasattr(builder, "create_descriptor_reduce"):
        return

    def create_descriptor_reduce(self, kind, desc, value, indices):
        if kind != ir.DESCRIPTOR_REDUCE_KIND.ADD:
            raise NotImplementedError(f"descriptor reduce {kind} under the interpreter")
        ptrs, mask = desc.materialize_pointers(indices)
        op = ir.ATOMIC_OP.FADD if value.dtype.scalar.is_floating() else ir.ATOMIC_OP.ADD
        self.create_atomic_rmw(op, ptrs, value, mask, ir.MEM_SEMANTIC.RELAXED, None)

    builder.create_descriptor_reduce = create_descriptor_reduce


def ensure_allocator() -> None:
    """Device-side tensor descriptors (`tl.make_tensor_descriptor`) need a global scratch
    allocator: Triton writes each program's descriptors there. Install a torch-backed one
    unless the current context already has one (never replace somebody else's); checked per
    call because Triton keeps the allocator in a ContextVar (per thread or task)."""
    import triton

    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):  # pragma: no cover - Triton internals moved
        pass

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc)


def random_inputs(M: int, N: int, K: int, dtype: torch.dtype, device, *, transpose_a=False, transpose_b=False, seed=None):
    """Fresh normal inputs (never zeros), optionally as transposed views."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed if seed is not None else torch.seed() % (2**31))
    a = torch.randn((K, M) if transpose_a else (M, K), generator=g, dtype=torch.float32).to(dtype).to(device)
    b = torch.randn((N, K) if transpose_b else (K, N), generator=g, dtype=torch.float32).to(dtype).to(device)
    return (a.t() if transpose_a else a), (b.t() if transpose_b else b)


def self_check(matmul, shapes, dtypes=(torch.float16, torch.bfloat16, torch.float32), **kwargs) -> None:
    """Run `matmul` on fresh random inputs for each shape and dtype and assert the error is
    under the dtype's tolerance. Used by each schedule's `__main__`."""
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    fix_interpreter_bf16_dot()
    for (M, N, K) in shapes:
        for dtype in dtypes:
            for ta, tb in ((False, False), (True, False), (False, True)):
                a, b = random_inputs(M, N, K, dtype, device, transpose_a=ta, transpose_b=tb)
                out = matmul(a, b, **kwargs)
                err = rel_error(out, reference(a, b))
                tol = TOLERANCE[dtype]
                assert out.shape == (M, N) and out.dtype == dtype, (out.shape, out.dtype)
                assert err <= tol, f"M={M} N={N} K={K} {dtype} ta={ta} tb={tb}: rel err {err:.3e} > {tol:.0e}"
                print(f"ok  M={M:<5} N={N:<5} K={K:<6} {dtype!s:<15} ta={ta:d} tb={tb:d}  rel_err={err:.2e}")


def prepare_output(out: torch.Tensor | None, M: int, N: int, like: torch.Tensor, name: str = "out") -> torch.Tensor:
    """The (M, N) result tensor: a fresh one in `like`'s dtype and device, or the caller's
    `out` after checking it fits (any strides are fine: kernels take them as arguments).
    `name` is what the messages call it (grouped_gemm: "out[3]")."""
    if out is None:
        return torch.empty((M, N), device=like.device, dtype=like.dtype)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"{name} has shape {tuple(out.shape)}, expected {(M, N)}")
    if out.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {out.dtype}, expected {like.dtype} (the inputs' dtype)")
    if out.device != like.device:
        raise ValueError(f"{name} is on {out.device}, the inputs on {like.device}")
    return out


def stride_hints(*tensors: torch.Tensor) -> int:
    """Each stride's power-of-two factor (1..16) of the tensors' two dimensions, packed 5 bits a
    stride in order (A's two, then B's two): `dp_gemm.mac_loop`'s HINTS. Triton specializes an
    integer argument only when it divides by 16, so rows of K = 8200 bf16 elements (16-byte
    aligned: 8200 = 8 x 1025) otherwise get no vector loads; a unit or zero stride gets no
    hint (1)."""
    packed, shift = 0, 0
    for t in tensors:
        for s in t.stride():
            m = min(16, s & -s) if s > 1 else 1
            packed |= m << shift
            shift += 5
    return packed


def needs_int64_offsets(*tensors: torch.Tensor) -> bool:
    """True when some element offset (sum of index * stride) of a tensor reaches 2**31, so a
    kernel must compute offsets in int64 instead of Triton's default int32."""
    return any(t is not None and _max_offset(t.shape, t.stride()) >= 2**31 - 1 for t in tensors)


@functools.lru_cache(maxsize=1024)  # per (shape, strides): host time on every launch
def _max_offset(shape: tuple, strides: tuple) -> int:
    if 0 in shape:
        return 0
    return sum((size - 1) * abs(stride) for size, stride in zip(shape, strides))


try:  # the current stream's handle without building a torch.cuda.Stream (as Triton's driver does)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # a torch built without CUDA
    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


class ZeroedScratch:
    """fp32/int32 scratch buffers that kernels hand back zeroed, cached per (device, stream).

    Split-K and Stream-K reductions need a zeroed fp32 accumulation buffer and per-tile
    arrival counters. Zeroing them before every launch costs a memset launch, so the kernels
    that use this pool restore zeros themselves before they exit (the last program to touch a
    tile clears its slot and counter), and the pool only zeroes memory it allocates. The
    cache key includes the current CUDA stream: launches on one stream run in order, so they
    may share a buffer; launches on different streams get different buffers.
    Caveat: a kernel killed mid-flight (device fault) leaves a dirty buffer; `clear()` drops
    the cache."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._views: dict[tuple, torch.Tensor] = {}  # (key, numel) -> buf[:numel], saves host time

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if not isinstance(device, torch.device):
            device = torch.device(device)
        stream = _raw_stream(device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else 0
        key = (name, dtype, device.type, device.index, stream)
        view = self._views.get((key, numel))
        if view is not None:
            return view
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            # grow geometrically so that a sweep over shapes does not reallocate every call
            size = max(numel, 2 * buf.numel()) if buf is not None else numel
            buf = torch.zeros(size, dtype=dtype, device=device)
            self._buffers[key] = buf
            self._views = {k: v for k, v in self._views.items() if k[0] != key}  # views of the old buffer
        if len(self._views) >= 256:  # a sweep over many shapes: keep the cache small
            self._views.clear()
        view = self._views[(key, numel)] = buf[:numel]
        return view

    def clear(self) -> None:
        self._buffers.clear()
        self._views.clear()


SCRATCH = ZeroedScratch()


# Opt-in dynamic shared memory per block on sm_90: 227 KB. Search spaces keep
# every config's estimate under it so that no config fails to launch on the target.
SMEM_PER_BLOCK_SM90 = 227 * 1024


def pipeline_smem_bytes(block_m: int, block_n: int, block_k: int, num_stages: int, elt: int) -> int:
    """Shared memory of a software-pipelined GEMM main loop: one A and one B tile per stage."""
    return num_stages * (block_m * block_k + block_k * block_n) * elt
