"""Run, verify and time GEMM candidates for one shape within a time budget.

`run_shape(M, N, K, dtype, strategies, budget_s)` is what `advisor bench` and
`advisor diagnose --run` call. It

1. times the baselines: `torch.matmul` (cuBLAS) and our data-parallel schedule `dp` (its
   default config, then a few more from its search space within a share of the budget);
2. walks the candidates of each strategy in the order given (the analytical model's
   ranking), round-robin across strategies so each gets its best-ranked configs tried,
   until the shape's budget is spent (compile time counts);
3. re-checks and re-times each provider's winner on fresh inputs ("final" rows), so the
   reported number is not the luckiest of many draws and a flaky winner is caught;
4. returns long-format rows (rows.COLUMNS), one per variant, failures included.

Each variant is checked before it is timed (Checker: fresh random inputs, NaN-poisoned
`out=`, float64 truth) and anything that fails to compile, launch, or match is recorded
with its status and reason and never timed, so it can never win.

A progress bar in a CLI (click) can follow the budget:

    with click.progressbar(length=1000, label=shape) as bar:
        def progress(p):
            bar.update(int(1000 * min(1.0, p.elapsed_s / max(p.budget_s, 1e-9))) - bar.pos)
        rows = run_shape(M, N, K, "bf16", ordered, budget_s, progress)

Time limits: each variant runs under SIGALRM (main thread only, POSIX only; elsewhere
without a limit). The alarm interrupts Python code, including Triton's compile loop, but
not a thread blocked inside a CUDA call: a kernel that never finishes (a spin-wait that
deadlocks) holds `torch.cuda.synchronize()` forever. For that, and for errors that kill
the CUDA context (an illegal address poisons every later call in the process), run the
work in a child process: `advisor.run.bench.isolate` does that and restarts past the culprit.
After any failure here the device is probed; if the context is gone, `DeviceLost` is
raised carrying the rows measured so far.
"""

from __future__ import annotations

import inspect
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from . import rows as R
from .timing import gpu_available, l2_bytes, resolve_timer, rotating, rotation_count, time_fn
from .verify import CheckFailed, Checker, dtype_from_name, dtype_name, make_generator, random_matrix

BASELINE_TORCH = "torch.matmul"
BASELINE_DP = "dp"

# Default knobs of a run; callers override per call.
DEFAULT_VARIANT_TIMEOUT_S = 45.0  # one compile (seconds) + two checks + ~0.1 s of timing, with a wide margin
DEFAULT_DP_SHARE = 0.25  # share of a shape's budget the dp baseline's short search may use
DEFAULT_DP_CONFIGS = 4  # dp configs tried at most: default + 3 from its search space
GRACE_S = 5.0  # a variant started near the end of the budget may overrun it by this much
FINAL_REP_SCALE = 2.0  # the final re-timing of each finalist repeats twice as long in all (split over rounds)
# The final pass re-times each provider's best FINAL_TOP search configs in FINAL_ROUNDS
# interleaved rounds (every finalist once per round, the order rotated) and keeps the median
# of the round medians. On the H200 (2026-11-29) one config timed 411 us in the search and
# 525 us in a later back-to-back final: clocks drift over a run, so times taken minutes apart
# are not comparable, and the best of many noisy search times is biased low.
FINAL_TOP = 3
FINAL_ROUNDS = 3


class VariantTimeout(BaseException):
    """Raised by the SIGALRM handler. A BaseException so that a schedule's broad
    `except Exception` cannot swallow it."""


class DeviceLost(RuntimeError):
    """The CUDA context is unusable after a variant failed; `rows` holds what was measured."""

    def __init__(self, message: str, rows: list[dict]):
        super().__init__(message)
        self.rows = rows


@dataclass(frozen=True)
class Progress:
    """Passed to the progress callback before (row=None) and after each variant."""

    shape: str
    provider: str
    config: str
    phase: str
    index: int  # variants started so far for this shape, this one included
    planned: int  # variants planned for this shape (the budget may stop earlier)
    elapsed_s: float
    budget_s: float
    row: dict | None = None


@dataclass
class Candidate:
    provider: str
    config: object  # the schedule's Config, a dict for library calls, or None
    call: Callable  # call(a, b, out) -> tensor
    mandatory: bool = False  # baselines run even when the budget is spent

    @property
    def config_text(self) -> str:
        return R.config_json(self.config)


def variant_key(suite: str, phase: str, provider: str, config_text: str) -> tuple[str, str, str, str]:
    """Identity of one measurement within a job: what the isolating driver uses to skip
    variants already done (or known to crash) when it restarts a worker."""
    return (suite, phase, provider, config_text or "")


def row_variant_key(row: dict) -> tuple[str, str, str, str]:
    return variant_key(row.get("suite") or "", row.get("phase") or "search", row.get("provider") or "",
                       row.get("config") or "")


# --------------------------------------------------------------------------------------
# Time limit and failure classification
# --------------------------------------------------------------------------------------


@contextmanager
def time_limit(seconds: float | None):
    """Raise VariantTimeout in the main thread after `seconds` (see module doc for limits)."""
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "SIGALRM")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def handler(signum, frame):
        raise VariantTimeout(f"over the {seconds:.0f} s limit for one variant")

    old = signal.signal(signal.SIGALRM, handler)
    # SA_RESTART: a system call inside a C library (the CUDA driver) that the alarm lands in
    # is restarted rather than failed with EINTR; the handler runs once Python code resumes.
    signal.siginterrupt(signal.SIGALRM, False)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_COMPILE_WORDS = ("PassManager", "MLIR", "ptxas", "LLVM ERROR", "CompilationError", "out of resource",
                  "OutOfResources", "shared memory", "compile")


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - some exception classes fail to format when half-built
        return repr(getattr(exc, "args", ""))


def classify(exc: BaseException) -> str:
    """Status for an exception raised while running a candidate."""
    if isinstance(exc, VariantTimeout):
        return "timeout"
    if isinstance(exc, CheckFailed):
        return "wrong"
    mod = type(exc).__module__ or ""
    text = f"{type(exc).__name__}: {_safe_str(exc)}"
    if mod.startswith("triton") and "runtime.errors" not in mod:
        return "compile_error"  # triton.compiler.errors.*: CompilationError, static asserts
    if any(w in text for w in _COMPILE_WORDS) and "CUDA" not in text:
        return "compile_error"
    if isinstance(exc, (ValueError, NotImplementedError)):
        return "skipped"  # the launcher refused the shape/config: not applicable here
    return "launch_error"


def _error_text(exc: BaseException) -> str:
    lines = [ln for ln in _safe_str(exc).strip().splitlines() if ln.strip()]
    # Triton compile errors put the useful line last; CUDA errors first. Keep both ends.
    msg = lines[0] if len(lines) <= 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {msg}"


def device_healthy() -> bool:
    """False when the CUDA context can no longer run work (sticky error)."""
    if not gpu_available():
        return True
    import torch

    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


# --------------------------------------------------------------------------------------
# Schedules and candidates
# --------------------------------------------------------------------------------------


def call_flex(fn: Callable, M: int, N: int, K: int, dtype, num_sms: int):
    """Call a schedule's default_config/search_space, passing num_sms only if it takes it
    (the contract is fn(M, N, K, dtype, num_sms); some files omit num_sms)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(M, N, K, dtype, num_sms)
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if "num_sms" in params:
        return fn(M, N, K, dtype, num_sms=num_sms)
    if len(positional) >= 5 or any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return fn(M, N, K, dtype, num_sms)
    return fn(M, N, K, dtype)


def candidate_configs(module, M: int, N: int, K: int, dtype, num_sms: int, *,
                      max_configs: int | None = None, quick: bool = False) -> list:
    """A schedule's candidates for a shape, unranked order: its default_config first, then
    its search space (duplicates dropped). `quick`: the default config only."""
    dtype = dtype_from_name(dtype)
    first = call_flex(module.default_config, M, N, K, dtype, num_sms)
    if quick:
        return [first]
    out, seen = [first], {R.config_json(first)}
    for c in call_flex(module.search_space, M, N, K, dtype, num_sms):
        t = R.config_json(c)
        if t not in seen:
            seen.add(t)
            out.append(c)
    return out[:max_configs] if max_configs else out


def model_order(strategy: str, configs: Sequence, M: int, N: int, K: int, dtype, num_sms: int, *,
                prune_ratio: float = 3.0, keep_at_least: int = 4) -> list:
    """`configs` reordered by advisor.codegen.schedule_model's predicted time, the first one (the
    schedule's own default) kept first; candidates predicted over `prune_ratio` x the best
    are dropped (at least `keep_at_least` kept). Falls back to the given order if the model
    cannot rank them."""
    configs = list(configs)
    if len(configs) <= 2:
        return configs
    try:
        import torch

        from advisor.codegen import schedule_model

        elt = torch.empty((), dtype=dtype_from_name(dtype)).element_size()
        dev = schedule_model.Device(sm_count=int(num_sms))
        preds = schedule_model.rank(strategy, configs[1:], M, N, K, elt, dev, prune_ratio=prune_ratio,
                                    keep_at_least=keep_at_least)
        return [configs[0]] + [p.config for p in preds]
    except Exception:  # noqa: BLE001 - ordering is an optimisation; never lose the candidates
        return configs


def dp_candidates(dp_module, M: int, N: int, K: int, dtype, num_sms: int, max_configs: int) -> list:
    """The dp baseline's short search: its default config, then the model's best few."""
    cfgs = candidate_configs(dp_module, M, N, K, dtype, num_sms)
    return model_order("dp", cfgs, M, N, K, dtype, num_sms)[:max(1, max_configs)]


def _accepts_out(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "out" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def schedule_call(module, config) -> Callable:
    """call(a, b, out) for a schedule module's matmul with `config`; `out=` is passed when
    the launcher takes it (then the poisoned buffer must be filled), else ignored."""
    fn = module.matmul
    if _accepts_out(fn):
        return lambda a, b, out: fn(a, b, config, out=out)
    return lambda a, b, out: fn(a, b, config)


@contextmanager
def tf32_for(dtype):
    """cuBLAS runs fp32 as tf32 inside this context when `dtype` is fp32 (our schedules do);
    for other dtypes it changes nothing. The previous setting is restored on exit."""
    import torch

    if dtype_from_name(dtype or "bf16") != torch.float32:
        yield
        return
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def torch_call(dtype=None) -> Callable:
    """call(a, b, out) for cuBLAS via torch.matmul. For fp32 inputs TF32 is switched on
    around the call (tf32_for): our schedules run fp32 as tf32 on tensor cores, so this is
    the fair comparison (recorded as the config {"allow_tf32": true})."""
    import torch

    if dtype_from_name(dtype or "bf16") != torch.float32:
        return lambda a, b, out: torch.matmul(a, b, out=out)

    def call(a, b, out):
        with tf32_for(torch.float32):
            return torch.matmul(a, b, out=out)

    return call


def torch_config(dtype):
    import torch

    return {"allow_tf32": True} if dtype_from_name(dtype) == torch.float32 else None


def load_schedule(name: str, schedules: dict | None = None):
    """The module for strategy `name`: from `schedules` if given there, else kernel_lib."""
    if schedules and name in schedules:
        return schedules[name]
    from advisor.codegen import kernel_lib

    return kernel_lib.load(name)


def _round_robin(lists: dict[str, list]) -> Iterable[tuple[str, int, object]]:
    longest = max((len(v) for v in lists.values()), default=0)
    for i in range(longest):
        for name, cfgs in lists.items():
            if i < len(cfgs):
                yield name, i, cfgs[i]


# --------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------


def default_device() -> str:
    return "cuda" if gpu_available() else "cpu"


def device_sm_count(device: str) -> int:
    from advisor.codegen import kernel_lib

    return int(kernel_lib.load("common").num_sms(device if device.startswith("cuda") else None))


def environment(device: str | None = None, run_id: str | None = None) -> dict:
    """Device and software columns shared by every row of a run."""
    import torch

    device = device or default_device()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - the gpu extra is missing
        triton_version = ""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu (Triton interpreter)"
    return {
        "device": name, "sm_count": device_sm_count(device), "torch": torch.__version__,
        "triton": triton_version, "date": R.now_iso(), "run_id": run_id or R.new_run_id(),
    }


def prepare_interpreter() -> None:
    """Under TRITON_INTERPRET=1, apply the kernels' own fix for the interpreter's bf16 dot
    (kernels/common.fix_interpreter_bf16_dot) so CPU runs check real math; no-op on a GPU."""
    from .timing import interpreting

    if not interpreting():
        return
    from advisor.codegen import kernel_lib

    fix = getattr(kernel_lib.load("common"), "fix_interpreter_bf16_dot", None)
    if fix is not None:
        fix()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------
# One shape
# --------------------------------------------------------------------------------------


class ShapeBench:
    """Inputs, references and the measure step for one (M, N, K, dtype)."""

    def __init__(self, M: int, N: int, K: int, dtype, *, suite: str = "adhoc", device: str | None = None,
                 env: dict | None = None, timer: str = "auto", warmup_ms: float = 10, rep_ms: float = 50,
                 cpu_reps: int = 3, hbm_gbps: float | None = None, seed: int | None = None,
                 max_rotation_bytes: int | None = None):
        import torch

        prepare_interpreter()
        self.M, self.N, self.K = int(M), int(N), int(K)
        self.dtype = dtype_from_name(dtype)
        self.dtype_text = dtype_name(self.dtype)
        self.shape = R.shape_text(self.M, self.N, self.K)
        self.suite = suite
        self.device = device or default_device()
        self.env = env or environment(self.device)
        self.timer = resolve_timer(timer, self.device)
        self.warmup_ms, self.rep_ms, self.cpu_reps = warmup_ms, rep_ms, cpu_reps
        self.hbm_gbps = hbm_gbps
        self.seed = int(seed if seed is not None else time.time_ns() % (2**31))
        self.checker = Checker(self.M, self.N, self.K, self.dtype, self.device, seed=self.seed)
        elt = torch.empty((), dtype=self.dtype).element_size()
        self.flops = R.gemm_flops(self.M, self.N, self.K)
        self.bytes = R.gemm_bytes(self.M, self.N, self.K, elt)
        if self.device.startswith("cuda"):
            kw = {"max_bytes": max_rotation_bytes} if max_rotation_bytes else {}
            n_sets = rotation_count(self.bytes, l2_bytes(self.device), min_sets=2, **kw)
        else:
            n_sets = 1
        g = make_generator(self.device, self.seed + 17)
        self.timing_sets = [
            (random_matrix(self.M, self.K, self.dtype, self.device, g),
             random_matrix(self.K, self.N, self.dtype, self.device, g),
             torch.empty((self.M, self.N), dtype=self.dtype, device=self.device))
            for _ in range(n_sets)
        ]

    def row(self, cand_provider: str, config_text: str, status: str, error: str = "", **kw) -> dict:
        return R.make_row(suite=self.suite, shape=self.shape, M=self.M, N=self.N, K=self.K,
                          dtype=self.dtype_text, provider=cand_provider, config=config_text,
                          status=status, error=error, flops=self.flops, bytes_moved=self.bytes,
                          hbm_gbps=self.hbm_gbps, timer=self.timer, env=self.env, **kw)

    def measure(self, cand: Candidate, *, limit_s: float | None, phase: str = "search",
                check_sets: Sequence[int] = (0, 1), timer: str | None = None, suite: str | None = None,
                rep_scale: float = 1.0) -> dict:
        """Check then time one candidate; always returns a row (status says how it went).
        Raises DeviceLost (with this row) if the failure killed the CUDA context."""
        first = {}

        def first_timed(a, b, out):
            t0 = time.perf_counter()
            res = cand.call(a, b, out)
            if "s" not in first:
                _sync(self.device)
                first["s"] = time.perf_counter() - t0
            return res

        timer = resolve_timer(timer, self.device) if timer else self.timer
        status, error, rel, timing = "ok", "", None, None
        try:
            with time_limit(limit_s):
                rel = self.checker.check(first_timed, sets=check_sets)
                calls = [(lambda a=a, b=b, o=o: cand.call(a, b, o)) for a, b, o in self.timing_sets]
                timing = time_fn(rotating(calls), method=timer, warmup_ms=self.warmup_ms,
                                 rep_ms=self.rep_ms * rep_scale, cpu_reps=self.cpu_reps)
                _sync(self.device)
        except VariantTimeout as exc:
            status, error = "timeout", str(exc)
        except CheckFailed as exc:
            status, error, rel = "wrong", str(exc), exc.rel_err
        except Exception as exc:  # noqa: BLE001 - any failure is recorded, the run goes on
            status, error = classify(exc), _error_text(exc)
            if "out of memory" in _safe_str(exc).lower() and self.device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()
        row = R.make_row(
            suite=suite or self.suite, shape=self.shape, M=self.M, N=self.N, K=self.K,
            dtype=self.dtype_text, provider=cand.provider, config=cand.config_text, phase=phase,
            status=status, error=error, median_ms=timing.median_ms if timing else None,
            p20_ms=timing.p20_ms if timing else None, p80_ms=timing.p80_ms if timing else None,
            flops=self.flops, bytes_moved=self.bytes, rel_err=rel, first_call_s=first.get("s"),
            hbm_gbps=self.hbm_gbps, timer=timer, env=self.env,
        )
        if status != "ok" and not device_healthy():
            raise DeviceLost(f"CUDA context lost after {cand.provider} {cand.config_text}: {error}", [row])
        return row


def final_candidates(search_rows: Iterable[dict], top: int = FINAL_TOP) -> list[dict]:
    """Each provider's `top` fastest verified search rows (distinct configs), providers in
    first-seen order: the finalists of the interleaved re-timing."""
    by: dict[str, dict[str, dict]] = {}
    for r in search_rows:
        if r.get("status") != "ok" or not isinstance(r.get("median_us"), (int, float)):
            continue
        cfgs = by.setdefault(r["provider"], {})
        c = r.get("config") or ""
        if c not in cfgs or r["median_us"] < cfgs[c]["median_us"]:
            cfgs[c] = r
    out = []
    for cfgs in by.values():
        out += sorted(cfgs.values(), key=lambda r: r["median_us"])[:max(1, top)]
    return out


def combine_rounds(rows: list[dict]) -> dict | None:
    """One final row from a finalist's rounds: the median of the round medians (p20/p80: the
    lowest p20 and highest p80 seen); the first failure instead, if any round failed."""
    if not rows:
        return None
    bad = next((r for r in rows if r.get("status") != "ok"), None)
    if bad is not None:
        return bad
    meds = sorted(r["median_us"] for r in rows)
    mid = len(meds) // 2
    med = meds[mid] if len(meds) % 2 else 0.5 * (meds[mid - 1] + meds[mid])
    row = dict(rows[0])
    scale = med / row["median_us"]
    row["median_us"] = med
    p20 = [r["p20_us"] for r in rows if r.get("p20_us") is not None]
    p80 = [r["p80_us"] for r in rows if r.get("p80_us") is not None]
    errs = [r["rel_err"] for r in rows if r.get("rel_err") is not None]
    row["p20_us"] = min(p20) if p20 else None
    row["p80_us"] = max(p80) if p80 else None
    row["rel_err"] = max(errs) if errs else None
    for k in ("tflops", "gbps"):
        if row.get(k):
            row[k] = row[k] / scale
    row["rounds"] = len(rows)
    return row


def run_shape(M: int, N: int, K: int, dtype, strategies: dict[str, Sequence], budget_s: float,
              progress: Callable[[Progress], None] | None = None, *, suite: str = "adhoc",
              baselines: Sequence[str] = (BASELINE_TORCH, BASELINE_DP), dp_configs: Sequence | None = None,
              dp_max_configs: int = DEFAULT_DP_CONFIGS, dp_share: float = DEFAULT_DP_SHARE,
              variant_timeout_s: float = DEFAULT_VARIANT_TIMEOUT_S, timer: str = "auto",
              warmup_ms: float = 10, rep_ms: float = 50, cpu_reps: int = 3, final: bool = True,
              schedules: dict | None = None, skip: Iterable[tuple] = (), known: dict | None = None,
              prior_rows: Sequence[dict] = (), on_start: Callable[[tuple], None] | None = None,
              hbm_gbps: float | None = None, env: dict | None = None, device: str | None = None,
              seed: int | None = None, extra_timers: Sequence[str] = ()) -> list[dict]:
    """Measure baselines and candidates for one GEMM shape; return long-format rows.

    strategies: {strategy id: configs in the order to try} (the analytical model's ranking);
        strategy ids are kernel_lib's ("split_k", "stream_k", ...), or keys of `schedules`.
    budget_s: wall-clock budget for the shape, compile time included. Baselines
        (torch.matmul and dp's default config) always run; other variants start only while
        budget is left, and each is limited to min(variant_timeout_s, left + GRACE_S).
    progress: called with a Progress before and after every variant.
    skip / known / prior_rows / on_start: used by the process-isolating driver to resume
        after a crash: variant keys (phase, provider, config JSON) not to run again,
        outcomes known without running ({key: (status, error)}), rows already measured
        (they count for the final pass), and a hook called with each key before it runs.
    extra_timers: re-time torch.matmul with these timers too (suite "timer_check").
    """
    start = time.monotonic()
    deadline = start + max(0.0, float(budget_s))
    known = dict(known or {})
    skip = set(skip)
    dtype = dtype_from_name(dtype)
    sb = ShapeBench(M, N, K, dtype, suite=suite, device=device, env=env, timer=timer, warmup_ms=warmup_ms,
                    rep_ms=rep_ms, cpu_reps=cpu_reps, hbm_gbps=hbm_gbps, seed=seed)
    num_sms = int(sb.env.get("sm_count") or device_sm_count(sb.device))
    out: list[dict] = []
    cands: dict[tuple, Candidate] = {}

    # ---- plan: baselines, then the strategies round-robin ------------------------------
    plan: list[tuple[Candidate, str]] = []  # (candidate, budget group: mandatory | dp | search)
    if BASELINE_TORCH in baselines:
        plan.append((Candidate(BASELINE_TORCH, torch_config(dtype), torch_call(dtype), mandatory=True),
                     "mandatory"))
    unavailable: list[dict] = []
    if BASELINE_DP in baselines:
        try:
            dp = load_schedule(BASELINE_DP, schedules)
            cfgs = list(dp_configs) if dp_configs is not None else dp_candidates(
                dp, sb.M, sb.N, sb.K, dtype, num_sms, dp_max_configs)
            for i, c in enumerate(cfgs):
                plan.append((Candidate(BASELINE_DP, c, schedule_call(dp, c), mandatory=(i == 0)),
                             "mandatory" if i == 0 else "dp"))
        except Exception as exc:  # noqa: BLE001 - a missing/broken dp file is a recorded result
            unavailable.append(sb.row(BASELINE_DP, "", "skipped" if isinstance(exc, ImportError)
                                      else "compile_error", f"schedule not available: {_error_text(exc)}"))
    lists: dict[str, list] = {}
    modules = {}
    for name, cfgs in strategies.items():
        try:
            modules[name] = load_schedule(name, schedules)
            lists[name] = list(cfgs)
        except Exception as exc:  # noqa: BLE001
            unavailable.append(sb.row(name, "", "skipped" if isinstance(exc, ImportError) else "compile_error",
                                      f"schedule not available: {_error_text(exc)}"))
    for name, _, c in _round_robin(lists):
        plan.append((Candidate(name, c, schedule_call(modules[name], c)), "search"))

    seen: set[tuple] = set()
    unique = []
    for cand, group in plan:
        key = variant_key(sb.suite, "search", cand.provider, cand.config_text)
        if key not in seen:
            seen.add(key)
            unique.append((cand, group))
            cands[key] = cand
    plan = unique
    unavailable = [r for r in unavailable if row_variant_key(r) not in skip]
    out.extend(unavailable)
    for r in unavailable:
        if progress:
            progress(Progress(sb.shape, r["provider"], "", "search", 0, len(plan), 0.0, budget_s, r))

    # ---- search ---------------------------------------------------------------------------
    tried = {name: 0 for name in lists}
    for index, (cand, group) in enumerate(plan, 1):
        key = variant_key(sb.suite, "search", cand.provider, cand.config_text)
        if key in skip:
            if cand.provider in tried:
                tried[cand.provider] += 1
            continue
        now = time.monotonic()
        left = deadline - now
        if key not in known:  # known outcomes cost nothing: always recorded
            if group == "dp" and now - start > dp_share * budget_s:
                continue
            if group != "mandatory" and left <= 0:
                continue
        limit = variant_timeout_s if group == "mandatory" else min(variant_timeout_s, left + GRACE_S)
        if progress:
            progress(Progress(sb.shape, cand.provider, cand.config_text, "search", index, len(plan),
                              now - start, budget_s))
        if key in known:
            status, error = known[key]
            row = sb.row(cand.provider, cand.config_text, status, error)
        else:
            if on_start:
                on_start(key)
            try:
                row = sb.measure(cand, limit_s=limit, phase="search")
            except DeviceLost as exc:
                exc.rows = out + exc.rows
                raise
        if cand.provider in tried:
            tried[cand.provider] += 1
        out.append(row)
        if progress:
            progress(Progress(sb.shape, cand.provider, cand.config_text, "search", index, len(plan),
                              time.monotonic() - start, budget_s, row))
    for name, n in tried.items():
        if n == 0 and lists[name] and variant_key(sb.suite, "search", name, "") not in skip:
            out.append(sb.row(name, "", "skipped", f"shape budget of {budget_s:.0f} s spent before its first config"))

    # ---- final: re-check and re-time the finalists side by side, interleaved ----------
    if final:
        pool = [r for r in list(prior_rows) + out if r.get("phase", "search") == "search"]
        finalists = final_candidates(pool, top=FINAL_TOP)
        todo = []
        for r in finalists:
            cand = cands.get(variant_key(sb.suite, "search", r["provider"], r.get("config") or ""))
            key = variant_key(sb.suite, "final", r["provider"], r.get("config") or "")
            if cand is not None and key not in skip:
                todo.append((key, cand))
        rounds: dict[tuple, list[dict]] = {key: [] for key, _ in todo}
        for rnd in range(FINAL_ROUNDS):
            shift = rnd % max(1, len(todo))
            for key, cand in todo[shift:] + todo[:shift]:
                got = rounds[key]
                if got and got[-1]["status"] != "ok":
                    continue  # failed once: that is its final word
                if progress:
                    progress(Progress(sb.shape, cand.provider, cand.config_text, "final", len(plan), len(plan),
                                      time.monotonic() - start, budget_s))
                if on_start and rnd == 0:
                    on_start(key)
                try:
                    got.append(sb.measure(cand, limit_s=variant_timeout_s, phase="final", check_sets=(2,),
                                          rep_scale=FINAL_REP_SCALE / FINAL_ROUNDS))
                except DeviceLost as exc:
                    exc.rows = out + exc.rows
                    raise
        for key, cand in todo:  # every finalist was measured in round 0 at least
            row = combine_rounds(rounds[key])
            out.append(row)
            if progress:
                progress(Progress(sb.shape, cand.provider, cand.config_text, "final", len(plan), len(plan),
                                  time.monotonic() - start, budget_s, row))
    for t in extra_timers:
        if BASELINE_TORCH not in baselines or resolve_timer(t, sb.device) == sb.timer:
            continue
        key = variant_key("timer_check", "final", BASELINE_TORCH, R.config_json(torch_config(dtype)))
        if key in skip:
            continue
        if on_start:
            on_start(key)
        try:
            row = sb.measure(Candidate(BASELINE_TORCH, torch_config(dtype), torch_call(dtype)), limit_s=variant_timeout_s,
                             phase="final", check_sets=(0,), timer=t, suite="timer_check")
        except DeviceLost as exc:
            exc.rows = out + exc.rows
            raise
        out.append(row)
    return out
