"""Correctness checks for GEMM candidates: fresh random inputs, poisoned outputs, float64 truth.

For each shape a `Checker` draws a few input sets (normal random values, never zeros) and
computes their float64 product once, on the GPU when there is one (an 8192^3 float64 GEMM
takes tens of milliseconds there, minutes on a CPU), caching it for every candidate of the
shape. A candidate is run on each set with its output buffer filled with NaN first, and
passes when no element is NaN/inf (every element was written) and the relative Frobenius
error ||out - ref|| / ||ref|| is within the dtype's tolerance (kernels/common.TOLERANCE,
justified there). NaN never passes.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence


def dtype_from_name(name):
    import torch

    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
             "float32": torch.float32, "float": torch.float32}
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower().replace("torch.", "")
    if key not in table:
        raise ValueError(f"unknown dtype {name!r} (bf16, fp16, fp32)")
    return table[key]


def dtype_name(dtype) -> str:
    import torch

    dtype = dtype_from_name(dtype)
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def tolerance(dtype) -> float:
    """Per-dtype relative error bound, from kernels/common.TOLERANCE (one source of truth)."""
    from advisor.codegen import kernel_lib

    common = kernel_lib.load("common")
    return float(common.TOLERANCE[dtype_from_name(dtype)])


def random_matrix(rows: int, cols: int, dtype, device, generator):
    """Standard normal values rounded to `dtype`: never zeros, both signs, no structure."""
    import torch

    return torch.randn((rows, cols), generator=generator, device=device, dtype=torch.float32).to(dtype)


def make_generator(device, seed: int):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def relative_error(out, ref) -> float:
    """||out - ref||_F / ||ref||_F in float64 on out's device; inf if out holds NaN/inf."""
    import torch

    if not bool(torch.isfinite(out).all()):
        return math.inf
    diff = out.to(torch.float64) - ref
    denom = float(torch.linalg.vector_norm(ref))
    return float(torch.linalg.vector_norm(diff)) / (denom if denom > 0 else 1.0)


class CheckFailed(Exception):
    """The candidate ran but its output is wrong (status "wrong")."""

    def __init__(self, message: str, rel_err: float):
        super().__init__(message)
        self.rel_err = rel_err


class Checker:
    """Check sets for one GEMM shape; references are computed once per set and cached."""

    def __init__(self, M: int, N: int, K: int, dtype, device, *, seed: int = 0):
        self.M, self.N, self.K = M, N, K
        self.dtype = dtype_from_name(dtype)
        self.device = device
        self.seed = int(seed)
        self.tol = tolerance(self.dtype)
        self._sets: dict[int, tuple] = {}

    def input_set(self, index: int):
        """(a, b, ref) of check set `index`, drawn and solved on first use."""
        import torch

        if index not in self._sets:
            g = make_generator(self.device, self.seed * 1_000_003 + index)
            a = random_matrix(self.M, self.K, self.dtype, self.device, g)
            b = random_matrix(self.K, self.N, self.dtype, self.device, g)
            ref = a.to(torch.float64) @ b.to(torch.float64)
            self._sets[index] = (a, b, ref)
        return self._sets[index]

    def check(self, call: Callable, sets: Sequence[int] = (0, 1)) -> float:
        """Run call(a, b, out) on each check set with `out` poisoned; return the largest
        relative error, or raise CheckFailed (NaN/inf left, wrong shape/dtype, over tol)."""
        import torch

        worst = 0.0
        for index in sets:
            a, b, ref = self.input_set(index)
            out = torch.full((self.M, self.N), float("nan"), dtype=self.dtype, device=self.device)
            res = call(a, b, out)
            if self.device != "cpu" and str(self.device).startswith("cuda"):
                torch.cuda.synchronize()
            if res is None:
                res = out
            if tuple(res.shape) != (self.M, self.N) or res.dtype != self.dtype:
                raise CheckFailed(f"returned {tuple(res.shape)} {res.dtype}, expected "
                                  f"({self.M}, {self.N}) {self.dtype}", math.inf)
            err = relative_error(res, ref)
            if not math.isfinite(err):
                raise CheckFailed(f"NaN/inf in the output on check set {index} (unwritten or overflowed elements)", err)
            worst = max(worst, err)
            if err > self.tol:
                raise CheckFailed(f"rel err {err:.2e} > tol {self.tol:.0e} on check set {index}", err)
        return worst


class GroupedChecker:
    """Check sets for a group of GEMMs of different sizes; error = worst GEMM's error."""

    def __init__(self, sizes: Sequence[tuple[int, int, int]], dtype, device, *, seed: int = 0):
        self.sizes = [tuple(int(x) for x in s) for s in sizes]
        self.dtype = dtype_from_name(dtype)
        self.device = device
        self.seed = int(seed)
        self.tol = tolerance(self.dtype)
        self._sets: dict[int, tuple] = {}

    def input_set(self, index: int):
        import torch

        if index not in self._sets:
            g = make_generator(self.device, self.seed * 1_000_003 + 7919 + index)
            As = [random_matrix(M, K, self.dtype, self.device, g) for (M, N, K) in self.sizes]
            Bs = [random_matrix(K, N, self.dtype, self.device, g) for (M, N, K) in self.sizes]
            refs = [a.to(torch.float64) @ b.to(torch.float64) for a, b in zip(As, Bs)]
            self._sets[index] = (As, Bs, refs)
        return self._sets[index]

    def check(self, call: Callable, sets: Sequence[int] = (0, 1)) -> float:
        """call(As, Bs, outs) with every out poisoned; returns the list of results (or None
        to mean `outs`). Raises CheckFailed like Checker.check."""
        import torch

        worst = 0.0
        for index in sets:
            As, Bs, refs = self.input_set(index)
            outs = [torch.full((M, N), float("nan"), dtype=self.dtype, device=self.device)
                    for (M, N, K) in self.sizes]
            res = call(As, Bs, outs)
            if str(self.device).startswith("cuda"):
                torch.cuda.synchronize()
            if res is None:
                res = outs
            res = list(res)
            if len(res) != len(self.sizes):
                raise CheckFailed(f"returned {len(res)} outputs for {len(self.sizes)} GEMMs", math.inf)
            for g, (r, ref, (M, N, K)) in enumerate(zip(res, refs, self.sizes)):
                if tuple(r.shape) != (M, N) or r.dtype != self.dtype:
                    raise CheckFailed(f"GEMM {g}: returned {tuple(r.shape)} {r.dtype}, expected ({M}, {N}) "
                                      f"{self.dtype}", math.inf)
                err = relative_error(r, ref)
                if not math.isfinite(err):
                    raise CheckFailed(f"GEMM {g} ({M}x{N}x{K}): NaN/inf in the output on check set {index}", err)
                worst = max(worst, err)
                if err > self.tol:
                    raise CheckFailed(f"GEMM {g} ({M}x{N}x{K}): rel err {err:.2e} > tol {self.tol:.0e}", err)
        return worst
