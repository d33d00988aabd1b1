"""Run a program's GEMMs on the variants `advisor diagnose --run` verified, without editing it.

    import advisor
    with advisor.use("advisor-run") as routed:       # a RUN_DIR, or variant .py files
        train()                                      # unchanged code
    routed.calls                                     # {"variant_tail_wave_1664x1408x8192": 120}

Inside the block, `torch.matmul`, `torch.mm`, `torch.addmm`, `torch.nn.functional.linear`
(so `nn.Linear`) and the tensor methods `@`, `.mm`, `.matmul` look at each call: when both
operands are 2-D (or the left one is a stack of rows, as `linear` and `matmul` fold it), on a
CUDA device, of the dtype and M x N x K a variant was generated for, and laid out row-major or
transposed (`x @ W.T`), the variant computes it; anything else goes to torch untouched. Under
autograd, a routed GEMM is one `torch.autograd.Function` whose backward computes
grad_A = grad @ B^T and grad_B = A^T @ grad, each on a variant when one fits that shape (or its
transpose: a variant for grad^T @ A computes grad_B as (grad^T @ A)^T) and on torch otherwise.

From a RUN_DIR only verified variants are used: a result whose run never reached a GPU, whose
winner failed its check, or (unless `only_recommended=False`) that did not beat the baseline is
skipped with a warning; a variant file given by name whose run_report.json records a failed
check is refused (AdvisorError). A variant tuned on another GPU is used with a warning.
Patching is process-wide and not thread-safe: enter it once, around the code to route.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import AdvisorError

from ..basics import TORCH_DTYPE_NAMES as _DTYPE_NAMES


@dataclass
class Variant:
    name: str  # file stem: the key of Router.calls
    path: Path
    M: int
    N: int
    K: int
    dtype: Any  # torch.dtype
    strategy: str
    tuned_for: dict
    fn: Callable  # (a, b) -> a @ b


@dataclass
class Refused:
    name: str
    reason: str


def _load_module(path: Path):
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    mod_name = f"advisor_variant_{path.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise AdvisorError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:  # a broken or foreign file: one line, not a traceback
        del sys.modules[mod_name]
        raise AdvisorError(f"{path}: cannot load the variant ({type(exc).__name__}: {exc})") from None
    return mod


def load_variant(path: Path) -> Variant:
    """A generated GEMM variant file: its SHAPE, DTYPE, STRATEGY, TUNED_FOR and variant_matmul."""
    import torch

    mod = _load_module(path)
    shape, dtype = getattr(mod, "SHAPE", None), getattr(mod, "DTYPE", None)
    fn = getattr(mod, "variant_matmul", None)
    if not isinstance(shape, dict) or dtype not in _DTYPE_NAMES or not callable(fn):
        raise AdvisorError(f"{path}: not a GEMM variant written by `advisor generate` (no SHAPE/DTYPE/variant_matmul)")
    return Variant(name=path.stem, path=path, M=int(shape["M"]), N=int(shape["N"]), K=int(shape["K"]),
                   dtype=getattr(torch, _DTYPE_NAMES[dtype]), strategy=str(getattr(mod, "STRATEGY", "?")),
                   tuned_for=dict(getattr(mod, "TUNED_FOR", {}) or {}), fn=fn)


def _verdict_of(result: dict, only_recommended: bool) -> str | None:
    """Why a run_report.json result's variant must not be routed, or None when it may."""
    if not result.get("ran_on_gpu"):
        return "generated without a GPU and never checked: run `advisor diagnose --run` on a GPU"
    winner = result.get("winner")
    if not winner:
        return "no candidate passed its check"
    failed = [r for r in result.get("table", []) if r.get("provider") == winner.get("provider")
              and str(r.get("status", "ok")) != "ok"]
    if failed or str(winner.get("status", "ok")) != "ok":
        return f"its check failed ({(failed[0]['status'] if failed else winner.get('status'))})"
    if only_recommended and not result.get("recommended"):
        return f"verified but not faster than the baseline ({result.get('verdict', '')})"
    return None


def _report(run_dir: Path) -> dict:
    path = run_dir / "run_report.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdvisorError(f"{path}: cannot read the run report ({exc})") from None


def collect(sources: Iterable[str | Path], *, only_recommended: bool = True,
            allow_unverified: bool = False) -> tuple[list[Variant], list[Refused]]:
    """The variants to route from RUN_DIRs and variant files, and those refused (with why)."""
    variants: list[Variant] = []
    refused: list[Refused] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            if not (p / "run_report.json").is_file():
                raise AdvisorError(f"{p}: no run_report.json (a RUN_DIR is the --out of `advisor diagnose --run`)")
            for r in _report(p).get("results", []):
                if r.get("kind", "gemm") != "gemm" or not r.get("variant"):
                    continue
                why = _verdict_of(r, only_recommended)
                if why and not (allow_unverified and not r.get("ran_on_gpu")):
                    refused.append(Refused(Path(r["variant"]).stem, why))
                    continue
                variants.append(load_variant(p / Path(r["variant"]).name))
        elif p.is_file():
            report = p.parent / "run_report.json"
            if report.is_file():
                for r in _report(p.parent).get("results", []):
                    if r.get("variant") == p.name:
                        why = _verdict_of(r, only_recommended=False)
                        if why and not (allow_unverified and not r.get("ran_on_gpu")):
                            raise AdvisorError(f"{p.name}: refused: {why}")
            variants.append(load_variant(p))
        else:
            raise AdvisorError(f"{p}: no such RUN_DIR or variant file")
    return variants, refused


def _current_gpu(device) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)


def _layout_ok(t) -> bool:
    """Row-major, or the transpose of a row-major tensor (`W.T` of nn.Linear, `x.T` in backward)."""
    if t.dim() != 2:
        return False
    rows, cols = t.shape
    s0, s1 = t.stride()
    return (s1 == 1 and s0 >= max(cols, 1)) or (s0 == 1 and s1 >= max(rows, 1))


@dataclass
class Router:
    """The object `advisor.use` returns: `.calls` counts routed GEMMs per variant (backward
    ones included), `.passed` the matmul-family calls left to torch, `.refused` the variants
    not routed and why."""

    variants: list[Variant]
    refused: list[Refused] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    passed: int = 0
    _saved: list = field(default_factory=list, repr=False)
    _orig: dict = field(default_factory=dict, repr=False)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def __post_init__(self):
        self._by_key = {}
        for v in self.variants:
            self._by_key.setdefault((v.M, v.N, v.K, v.dtype), v)

    # ---------------------------------------------------------------- matching

    def _device_ok(self, t) -> bool:
        if t.device.type == "cuda":
            return True
        # the Triton interpreter runs variants on CPU tensors (tests, smoke runs)
        return t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"

    def _find(self, a, b) -> tuple[Variant | None, bool]:
        """The variant for a @ b and whether it computes the transposed product (b^T a^T)^T:
        autograd's weight gradient of x @ W^T comes as x^T @ grad (K x N), while the trace
        (and so the variant) has it as grad^T @ x (N x K), cuBLAS' order."""
        if getattr(self._local, "inside", False) or a.dim() != 2 or b.dim() != 2:
            return None, False
        if a.dtype != b.dtype or a.device != b.device or not self._device_ok(a):
            return None, False
        if not (_layout_ok(a) and _layout_ok(b)):
            return None, False
        M, K, N = a.shape[0], a.shape[1], b.shape[1]
        v = self._by_key.get((M, N, K, a.dtype))
        if v is not None:
            return v, False
        v = self._by_key.get((N, M, K, a.dtype))
        return v, v is not None

    def match(self, a, b) -> Variant | None:
        """The variant for a @ b (directly or as (b^T a^T)^T), or None."""
        return self._find(a, b)[0]

    def gemm(self, a, b):
        """a @ b for 2-D operands: on a variant when one fits, else torch.mm (no autograd)."""
        v, flipped = self._find(a, b)
        if v is None:
            return self._orig["torch.mm"](a, b)
        self._local.inside = True
        try:
            out = v.fn(b.t(), a.t()).t() if flipped else v.fn(a, b)
        finally:
            self._local.inside = False
        self.calls[v.name] = self.calls.get(v.name, 0) + 1
        return out

    def _mm(self, a, b):
        """Routed a @ b (2-D), through autograd when it records."""
        import torch

        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return _RoutedMM.apply(a, b, self)
        return self.gemm(a, b)

    def _skip(self) -> bool:
        import torch

        if getattr(self._local, "inside", False):
            return True
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        return bool(compiling()) or torch.jit.is_tracing()

    def _fits(self, a, b) -> bool:
        return self.match(a, b) is not None

    # ---------------------------------------------------------------- the patched functions

    def _matmul(self, a, b, *, out=None):
        orig = self._orig["torch.matmul"]
        if out is not None or self._skip() or not hasattr(a, "dim") or not hasattr(b, "dim"):
            return orig(a, b) if out is None else orig(a, b, out=out)
        if a.dim() >= 2 and b.dim() == 2 and a.shape[-1] == b.shape[0]:
            a2 = a.reshape(-1, a.shape[-1]) if a.dim() > 2 else a
            if self._fits(a2, b):
                y = self._mm(a2, b)
                return y.reshape(*a.shape[:-1], b.shape[1]) if a.dim() > 2 else y
        self.passed += 1
        return orig(a, b)

    def _mm_fn(self, a, b, *, out=None):
        orig = self._orig["torch.mm"]
        if out is None and not self._skip() and self._fits(a, b):
            return self._mm(a, b)
        self.passed += 1
        return orig(a, b) if out is None else orig(a, b, out=out)

    def _addmm(self, input, mat1, mat2, *, beta=1, alpha=1, out=None):
        orig = self._orig["torch.addmm"]
        if out is None and not self._skip() and self._fits(mat1, mat2):
            y = self._mm(mat1, mat2)
            if alpha != 1:
                y = y * alpha
            return y if beta == 0 else y + (input if beta == 1 else beta * input)
        self.passed += 1
        return orig(input, mat1, mat2, beta=beta, alpha=alpha) if out is None else orig(
            input, mat1, mat2, beta=beta, alpha=alpha, out=out)

    def _linear(self, input, weight, bias=None):
        orig = self._orig["F.linear"]
        if not self._skip() and input.dim() >= 1 and weight.dim() == 2:
            x2 = input.reshape(-1, input.shape[-1]) if input.dim() != 2 else input
            wt = weight.t()
            if self._fits(x2, wt):
                y = self._mm(x2, wt)
                if bias is not None:
                    y = y + bias
                return y.reshape(*input.shape[:-1], weight.shape[0]) if input.dim() != 2 else y
        self.passed += 1
        return orig(input, weight, bias)

    # ---------------------------------------------------------------- entering and leaving

    def _warn_devices(self) -> None:
        for v in self.variants:
            tuned = v.tuned_for.get("gpu")
            here = _current_gpu(None)
            if tuned and here and tuned != here:
                warnings.warn(f"advisor.use: {v.name} was tuned on {tuned}, this GPU is {here}: "
                              "it is correct but may be slow here; re-run `advisor diagnose --run` on this GPU",
                              stacklevel=3)

    def __enter__(self) -> "Router":
        import torch
        import torch.nn.functional as F

        self._warn_devices()
        self._orig = {"torch.matmul": torch.matmul, "torch.mm": torch.mm, "torch.addmm": torch.addmm,
                      "F.linear": F.linear}
        patches = [
            (torch, "matmul", lambda a, b, *, out=None: self._matmul(a, b, out=out)),
            (torch, "mm", lambda a, b, *, out=None: self._mm_fn(a, b, out=out)),
            (torch, "addmm", lambda i, m1, m2, *, beta=1, alpha=1, out=None: self._addmm(i, m1, m2, beta=beta,
                                                                                          alpha=alpha, out=out)),
            (F, "linear", lambda x, w, bias=None: self._linear(x, w, bias)),
            (torch.Tensor, "__matmul__", lambda a, b: self._matmul(a, b) if hasattr(b, "dim") else NotImplemented),
            (torch.Tensor, "matmul", lambda a, b: self._matmul(a, b)),
            (torch.Tensor, "mm", lambda a, b: self._mm_fn(a, b)),
        ]
        for owner, attr, fn in patches:
            self._saved.append((owner, attr, owner.__dict__.get(attr, getattr(owner, attr))))
            setattr(owner, attr, fn)
        return self

    def __exit__(self, *exc) -> None:
        while self._saved:
            owner, attr, old = self._saved.pop()
            setattr(owner, attr, old)


def _autograd_function():
    import torch

    class RoutedMM(torch.autograd.Function):
        """a @ b on a variant; backward's two GEMMs on variants where their shapes fit."""

        @staticmethod
        def forward(ctx, a, b, router):
            ctx.save_for_backward(a, b)
            ctx.router = router
            return router.gemm(a, b)

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            r = ctx.router
            grad = grad.contiguous() if not _layout_ok(grad) else grad
            ga = r.gemm(grad, b.t()) if ctx.needs_input_grad[0] else None
            gb = r.gemm(a.t(), grad) if ctx.needs_input_grad[1] else None
            return ga, gb, None

    return RoutedMM


class _Lazy:
    """The autograd.Function class, built on first use so that importing advisor needs no torch."""

    _cls = None

    def apply(self, *args):
        if _Lazy._cls is None:
            _Lazy._cls = _autograd_function()
        return _Lazy._cls.apply(*args)


_RoutedMM = _Lazy()


def use(*sources: str | Path, only_recommended: bool = True, allow_unverified: bool = False) -> Router:
    """A context manager routing matching GEMMs to the variants in `sources` (RUN_DIRs of
    `advisor diagnose --run` and/or generated variant files). Refused variants are warned
    about and listed in `.refused`; AdvisorError when nothing is left to route."""
    variants, refused = collect(sources, only_recommended=only_recommended, allow_unverified=allow_unverified)
    for r in refused:
        warnings.warn(f"advisor.use: not routing {r.name}: {r.reason}", stacklevel=2)
    if not variants:
        why = "; ".join(f"{r.name}: {r.reason}" for r in refused) or "no GEMM variant in them"
        raise AdvisorError(f"advisor.use: nothing to route from {', '.join(map(str, sources))} ({why})")
    return Router(variants, refused)


__all__ = ["Refused", "Router", "Variant", "collect", "load_variant", "use"]


# ------------------------------------------------------------------ a program run with routing

_SHIM = '''"""Written by advisor (advisor profile --use / advisor optimize): route this Python
process's matching GEMMs to verified variants, then hand over to any other sitecustomize."""
import atexit
import json
import os
import sys


def _advisor_use():
    sources = json.loads(os.environ.get("ADVISOR_USE_SOURCES", "[]"))
    calls_path = os.environ.get("ADVISOR_USE_CALLS")
    if not sources:
        return
    try:
        import advisor
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            router = advisor.use(*sources).__enter__()
        for w in said:
            print(f"advisor: {w.message}", file=sys.stderr)
    except Exception as exc:  # the program still runs, unrouted, and says so
        print(f"advisor: routing not active: {exc}", file=sys.stderr)
        return

    def dump():
        if calls_path:
            with open(f"{calls_path}.{os.getpid()}", "w") as fh:
                json.dump({"calls": router.calls, "passed": router.passed}, fh)

    atexit.register(dump)


_advisor_use()
_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:  # the next sitecustomize on the path, which this file shadows
    _cand = os.path.join(_p or ".", "sitecustomize.py")
    if os.path.abspath(_p or ".") != _here and os.path.isfile(_cand):
        with open(_cand, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _cand, "exec"), {"__name__": "sitecustomize", "__file__": _cand})
        break
'''


def routing_env(sources: Iterable[str | Path], where: Path, base: dict | None = None) -> dict[str, str]:
    """Environment for a child process that runs with advisor.use(*sources) active: a
    sitecustomize.py written under `where`, first on PYTHONPATH (with advisor's own location),
    and ADVISOR_USE_CALLS naming where each process writes its call counts (read them back
    with `routed_calls`). The variants are checked here first, so a refusal is an error now,
    not a warning lost in the program's output."""
    srcs = [str(Path(s).resolve()) for s in sources]
    variants, refused = collect(srcs)
    if not variants:
        why = "; ".join(f"{r.name}: {r.reason}" for r in refused) or "no GEMM variant in them"
        raise AdvisorError(f"--use: nothing to route from {', '.join(srcs)} ({why})")
    shim = where / "advisor_use_shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sitecustomize.py").write_text(_SHIM, encoding="utf-8")
    env = dict(os.environ if base is None else base)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), pkg_root, env.get("PYTHONPATH", "")) if p)
    env["ADVISOR_USE_SOURCES"] = json.dumps(srcs)
    env["ADVISOR_USE_CALLS"] = str(where / "routed_calls.json")
    for old in where.glob("routed_calls.json.*"):
        old.unlink()
    return env


def routed_calls(where: Path) -> dict[str, int]:
    """Calls per variant summed over the processes of a run made with routing_env(where)."""
    total: dict[str, int] = {}
    for f in sorted(where.glob("routed_calls.json.*")):
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for k, v in (data.get("calls") or {}).items():
            total[str(k)] = total.get(str(k), 0) + int(v)
    return total
