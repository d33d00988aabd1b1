"""Grouped GEMMs (many independent small products) and the device ceilings.

`run_grouped(sizes, dtype, configs, budget_s)` measures one group of GEMMs, e.g. the 64
mixed 128..512 products of issue 4, with these providers:

    torch.matmul              a Python loop of torch.matmul(a_i, b_i, out=c_i) (cuBLAS)
    cuda_graph                that loop captured once in a torch.cuda.CUDAGraph; replays timed
    torch._grouped_mm         PyTorch's grouped GEMM, when the group fits one of its forms
                              (bf16; 2-D x 3-D with a shared K and N, ragged M)
    torch._grouped_mm[padded] every GEMM zero-padded to the group's largest K and N so the
                              2-D x 3-D form applies (more arithmetic, one launch): what a
                              user could do today; timed on the padded call alone
    grouped                   our kernels/grouped_gemm.py, each config in the given order

Each provider is a setup function returning (run, extract): `run()` is the zero-argument
callable that is timed; `extract(result)` turns its result into the list of outputs that
is checked (slicing padded outputs stays out of the timed region).

`measure_ceilings()` measures the two ceilings METHOD.md asks for, first in a run: a large
device-to-device copy (bytes read + written over time) and a large cuBLAS GEMM.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ...basics import group_sizes
from . import rows as R
from .runner import (
    FINAL_REP_SCALE, GRACE_S, DEFAULT_VARIANT_TIMEOUT_S, DeviceLost, Progress, VariantTimeout, _error_text, _sync, classify,
    default_device, device_healthy, environment, load_schedule, prepare_interpreter,
    row_variant_key,
    tf32_for, time_limit, torch_config, variant_key,
)
from .timing import l2_bytes, resolve_timer, rotating, rotation_count, time_fn
from .verify import CheckFailed, GroupedChecker, dtype_from_name, dtype_name, make_generator, random_matrix

GROUPED = "grouped"


def group_label(count: int, lo: int, hi: int, seed: int) -> str:
    return f"{count} GEMMs {lo}..{hi} seed {seed}"


def job_sizes(job: dict) -> list[tuple]:
    """A grouped job's GEMMs: the ones it lists ("sizes", e.g. the shapes a trace's loop ran),
    else the seeded draw of count/lo/hi/seed."""
    if job.get("sizes"):
        return [tuple(int(x) for x in s) for s in job["sizes"]]
    return group_sizes(job["count"], job["lo"], job["hi"], job["seed"])


def job_label(job: dict) -> str:
    if job.get("sizes"):
        return job.get("label") or f"{len(job['sizes'])} GEMMs"
    return group_label(job["count"], job["lo"], job["hi"], job["seed"])


@dataclass
class GroupCandidate:
    provider: str
    config: object
    setup: Callable  # setup(As, Bs, outs) -> (run, extract)
    mandatory: bool = False

    @property
    def config_text(self) -> str:
        return R.config_json(self.config)


# --------------------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------------------


def _identity(x):
    return x


def loop_setup(As, Bs, outs):
    import torch

    def run():
        with tf32_for(As[0].dtype if As else None):
            for a, b, c in zip(As, Bs, outs):
                torch.matmul(a, b, out=c)
        return outs

    return run, _identity


def graph_setup(As, Bs, outs):
    import torch

    if not outs or not outs[0].is_cuda:
        raise NotImplementedError("CUDA graphs need a CUDA device")

    def body():  # cuBLAS picks its kernels at capture: tf32 for fp32 groups, as the loop
        with tf32_for(As[0].dtype if As else None):
            for a, b, c in zip(As, Bs, outs):
                torch.matmul(a, b, out=c)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm cuBLAS (handles, workspaces) outside the capture
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    torch.cuda.synchronize()
    for c in outs:  # the warm-up wrote them: poison again so the replay must rewrite them
        c.fill_(float("nan"))

    def run():
        graph.replay()
        return outs

    run._graph = graph  # keep the graph alive as long as the callable
    return run, _identity


def _grouped_mm_applicable(As) -> None:
    """NotImplementedError (recorded as skipped) where torch._grouped_mm cannot run at all:
    missing from this torch, or inputs other than bf16 (its only unscaled dtype)."""
    import torch

    if not hasattr(torch, "_grouped_mm"):
        raise NotImplementedError("torch._grouped_mm does not exist in this torch")
    if As[0].dtype != torch.bfloat16:
        raise NotImplementedError(f"torch._grouped_mm takes bf16 only, not {As[0].dtype}")


def grouped_mm_setup(As, Bs, outs):
    """torch._grouped_mm in its 2-D x 3-D form (shared K and N, ragged M) when the group
    allows it; NotImplementedError (recorded as skipped) when it cannot express the group."""
    import torch

    _grouped_mm_applicable(As)
    Ks = {a.shape[1] for a in As}
    Ns = {b.shape[1] for b in Bs}
    if len(Ks) != 1 or len(Ns) != 1:
        raise NotImplementedError(
            f"torch._grouped_mm needs a shared K and N for ragged M (this group has {len(Ks)} K values "
            f"and {len(Ns)} N values); see torch._grouped_mm[padded]")
    a_cat = torch.cat(list(As), 0)
    b_stack = torch.stack(list(Bs), 0)
    offs = torch.tensor([a.shape[0] for a in As], device=a_cat.device).cumsum(0).to(torch.int32)

    def run():
        return torch._grouped_mm(a_cat, b_stack, offs=offs)

    def extract(res):
        starts = [0] + offs.tolist()[:-1]
        return [res[s:s + a.shape[0]] for s, a in zip(starts, As)]

    return run, extract


def grouped_mm_padded_setup(As, Bs, outs, align: int = 16):
    """Every GEMM padded with zeros to the group's largest K and N (rounded up to `align`),
    then one torch._grouped_mm over the ragged M. The padding copies are setup, not timed."""
    import torch

    _grouped_mm_applicable(As)
    kmax = -(-max(a.shape[1] for a in As) // align) * align
    nmax = -(-max(b.shape[1] for b in Bs) // align) * align
    dev, dt = As[0].device, As[0].dtype
    a_cat = torch.zeros((sum(a.shape[0] for a in As), kmax), dtype=dt, device=dev)
    b_stack = torch.zeros((len(Bs), kmax, nmax), dtype=dt, device=dev)
    row = 0
    for i, (a, b) in enumerate(zip(As, Bs)):
        a_cat[row:row + a.shape[0], : a.shape[1]] = a
        b_stack[i, : b.shape[0], : b.shape[1]] = b
        row += a.shape[0]
    offs = torch.tensor([a.shape[0] for a in As], device=dev).cumsum(0).to(torch.int32)

    def run():
        return torch._grouped_mm(a_cat, b_stack, offs=offs)

    def extract(res):
        starts = [0] + offs.tolist()[:-1]
        return [res[s:s + a.shape[0], : b.shape[1]] for s, a, b in zip(starts, As, Bs)]

    return run, extract


def _params(fn) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def schedule_setup(module, config) -> Callable:
    """setup(As, Bs, outs) for kernels/grouped_gemm.py. The schedule's host-side plan
    (`prepare`, when it has one: device arrays of pointers, sizes and tile offsets) is
    built in setup, as a caller that runs the same group repeatedly would; outputs are
    passed as `out=`/`outs=` when the launcher takes them, so they are NaN-poisoned."""
    gm = module.grouped_matmul
    gm_params = _params(gm)
    prepare = getattr(module, "prepare", None)

    def setup(As, Bs, outs):
        kwargs = {}
        plan = None
        if prepare is not None:
            pp = _params(prepare)
            pkw = {}
            if "config" in pp:
                pkw["config"] = config
            if "out" in pp:
                pkw["out"] = outs
            elif "outs" in pp:
                pkw["outs"] = outs
            plan = prepare(As, Bs, **pkw)
        if plan is not None and "plan" in gm_params:
            kwargs["plan"] = plan
        if "out" in gm_params and not (plan is not None and "out" in _params(prepare)):
            kwargs["out"] = outs
        elif "outs" in gm_params and not (plan is not None and "outs" in _params(prepare)):
            kwargs["outs"] = outs

        def run():
            return gm(As, Bs, config, **kwargs)

        return run, _identity

    return setup


# --------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------


def grouped_timer(timer: str, device: str) -> str:
    """The timer for this suite. Its baselines measure launch cost (a Python loop of
    torch.matmul, that loop replayed as a CUDA graph), so the graph timer, which would capture
    the loop into a graph itself, is replaced by do_bench (H200, 2026-11-29: under the graph
    timer the loop timed like its graph, and the graph baseline failed to launch inside the
    capture)."""
    method = resolve_timer(timer, device)
    return "do_bench" if method == "graph" else method


class GroupBench:
    def __init__(self, sizes, dtype, *, suite: str, label: str, device: str, env: dict, timer: str,
                 warmup_ms: float, rep_ms: float, cpu_reps: int, seed: int):
        import torch

        prepare_interpreter()
        self.sizes = [tuple(int(x) for x in s) for s in sizes]
        self.dtype = dtype_from_name(dtype)
        self.dtype_text = dtype_name(self.dtype)
        self.suite, self.label, self.device, self.env = suite, label, device, env
        self.timer = grouped_timer(timer, device)
        self.warmup_ms, self.rep_ms, self.cpu_reps = warmup_ms, rep_ms, cpu_reps
        elt = self.dtype.itemsize
        self.flops = sum(R.gemm_flops(M, N, K) for M, N, K in self.sizes)
        self.bytes = sum(R.gemm_bytes(M, N, K, elt) for M, N, K in self.sizes)
        self.checker = GroupedChecker(self.sizes, self.dtype, device, seed=seed)
        n_sets = rotation_count(self.bytes, l2_bytes(device), min_sets=2) if device.startswith("cuda") else 1
        g = make_generator(device, seed + 31)
        self.timing_sets = []
        for _ in range(n_sets):
            As = [random_matrix(M, K, self.dtype, device, g) for M, N, K in self.sizes]
            Bs = [random_matrix(K, N, self.dtype, device, g) for M, N, K in self.sizes]
            outs = [torch.empty((M, N), dtype=self.dtype, device=device) for M, N, K in self.sizes]
            self.timing_sets.append((As, Bs, outs))

    def row(self, provider, config_text, status, error="", phase="search", **kw) -> dict:
        return R.make_row(suite=self.suite, shape=self.label, M=None, N=None, K=None, dtype=self.dtype_text,
                          provider=provider, config=config_text, phase=phase, status=status, error=error,
                          flops=self.flops, bytes_moved=self.bytes, timer=self.timer, env=self.env, **kw)

    def measure(self, cand: GroupCandidate, *, limit_s, phase="search", check_sets=(0, 1),
                rep_scale: float = 1.0) -> dict:
        first = {}

        def call(As, Bs, outs):
            t0 = time.perf_counter()
            run, extract = cand.setup(As, Bs, outs)
            res = extract(run())
            if "s" not in first:
                _sync(self.device)
                first["s"] = time.perf_counter() - t0
            return res

        status, error, rel, timing = "ok", "", None, None
        try:
            with time_limit(limit_s):
                rel = self.checker.check(call, sets=check_sets)
                runs = [cand.setup(As, Bs, outs)[0] for As, Bs, outs in self.timing_sets]
                timing = time_fn(rotating(runs), method=self.timer, warmup_ms=self.warmup_ms,
                                 rep_ms=self.rep_ms * rep_scale, cpu_reps=self.cpu_reps)
                _sync(self.device)
        except VariantTimeout as exc:
            status, error = "timeout", str(exc)
        except CheckFailed as exc:
            status, error, rel = "wrong", str(exc), exc.rel_err
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            status, error = classify(exc), _error_text(exc)
        row = self.row(cand.provider, cand.config_text, status, error, phase=phase,
                       median_ms=timing.median_ms if timing else None, p20_ms=timing.p20_ms if timing else None,
                       p80_ms=timing.p80_ms if timing else None, rel_err=rel, first_call_s=first.get("s"))
        if status != "ok" and not device_healthy():
            raise DeviceLost(f"CUDA context lost after {cand.provider} {cand.config_text}: {error}", [row])
        return row


def run_grouped(sizes: Sequence[tuple], dtype, configs: Sequence | None, budget_s: float,
                progress: Callable[[Progress], None] | None = None, *, suite: str = "grouped",
                label: str | None = None, module=None, variant_timeout_s: float = DEFAULT_VARIANT_TIMEOUT_S,
                timer: str = "auto", warmup_ms: float = 10, rep_ms: float = 50, cpu_reps: int = 3,
                final: bool = True, skip=(), known: dict | None = None, prior_rows: Sequence[dict] = (),
                on_start=None, env: dict | None = None, device: str | None = None, seed: int | None = None,
                baselines: Sequence[str] = ("torch.matmul", "cuda_graph", "torch._grouped_mm",
                                            "torch._grouped_mm[padded]")) -> list[dict]:
    """Measure one group of GEMMs: the baselines, then our grouped schedule's `configs` in
    order within `budget_s` (None: its default config only). Same row schema, failure
    handling and resume arguments as runner.run_shape."""
    start = time.monotonic()
    deadline = start + max(0.0, float(budget_s))
    device = device or default_device()
    env = env or environment(device)
    skip, known = set(skip), dict(known or {})
    label = label or f"{len(sizes)} GEMMs"
    gb = GroupBench(sizes, dtype, suite=suite, label=label, device=device, env=env, timer=timer,
                    warmup_ms=warmup_ms, rep_ms=rep_ms, cpu_reps=cpu_reps,
                    seed=int(seed if seed is not None else time.time_ns() % (2**31)))
    setups = {"torch.matmul": loop_setup, "cuda_graph": graph_setup, "torch._grouped_mm": grouped_mm_setup,
              "torch._grouped_mm[padded]": grouped_mm_padded_setup}
    # the cuBLAS loop and its graph run fp32 as tf32, recorded as their config (as in the GEMM suites)
    tf32 = torch_config(dtype)
    plan = [GroupCandidate(b, tf32 if b in ("torch.matmul", "cuda_graph") else None, setups[b], mandatory=True)
            for b in baselines]
    out: list[dict] = []
    try:
        module = module or load_schedule(GROUPED)
        if configs is None:
            configs = [grouped_default_config(module, gb.sizes, gb.dtype, int(env.get("sm_count") or 1))]
        # the first (default) config runs whatever the budget, as the baselines do: a verdict
        # on the group needs at least one grouped time
        plan += [GroupCandidate(GROUPED, c, schedule_setup(module, c), mandatory=(i == 0)) for i, c in enumerate(configs)]
    except Exception as exc:  # noqa: BLE001
        r = gb.row(GROUPED, "", "skipped" if isinstance(exc, ImportError) else "compile_error",
                   f"schedule not available: {_error_text(exc)}")
        if row_variant_key(r) not in skip:
            out.append(r)
    cands = {}
    for i, cand in enumerate(plan, 1):
        key = variant_key(suite, "search", cand.provider, cand.config_text)
        cands[key] = cand
        if key in skip:
            continue
        left = deadline - time.monotonic()
        if not cand.mandatory and left <= 0 and key not in known:
            continue
        limit = variant_timeout_s if cand.mandatory else min(variant_timeout_s, left + GRACE_S)
        if progress:
            progress(Progress(label, cand.provider, cand.config_text, "search", i, len(plan),
                              time.monotonic() - start, budget_s))
        if key in known:
            row = gb.row(cand.provider, cand.config_text, *known[key])
        else:
            if on_start:
                on_start(key)
            try:
                row = gb.measure(cand, limit_s=limit)
            except DeviceLost as exc:
                exc.rows = out + exc.rows
                raise
        out.append(row)
        if progress:
            progress(Progress(label, cand.provider, cand.config_text, "search", i, len(plan),
                              time.monotonic() - start, budget_s, row))
    if final:
        best: dict[str, dict] = {}
        for r in list(prior_rows) + out:
            if r.get("phase") == "search" and r.get("status") == "ok" and isinstance(r.get("median_us"), float):
                if r["provider"] not in best or r["median_us"] < best[r["provider"]]["median_us"]:
                    best[r["provider"]] = r
        for p, r in best.items():
            cand = cands.get(variant_key(suite, "search", p, r.get("config") or ""))
            key = variant_key(suite, "final", p, r.get("config") or "")
            if cand is None or key in skip:
                continue
            if on_start:
                on_start(key)
            try:
                out.append(gb.measure(cand, limit_s=variant_timeout_s, phase="final", check_sets=(2,),
                                      rep_scale=FINAL_REP_SCALE))
            except DeviceLost as exc:
                exc.rows = out + exc.rows
                raise
    return out


def grouped_default_config(module, sizes, dtype, num_sms):
    """The grouped schedule's default config for a group (its signature varies: try the
    group first, then the largest member as a single shape)."""
    return _call_group_fn(module.default_config, sizes, dtype_from_name(dtype), num_sms)


def grouped_candidates(module, sizes, dtype, num_sms, *, max_configs=None, quick=False) -> list:
    first = grouped_default_config(module, sizes, dtype, num_sms)
    if quick or not hasattr(module, "search_space"):
        return [first]
    out, seen = [first], {R.config_json(first)}
    for c in _call_group_fn(module.search_space, sizes, dtype_from_name(dtype), num_sms):
        t = R.config_json(c)
        if t not in seen:
            seen.add(t)
            out.append(c)
    return out[:max_configs] if max_configs else out


def _call_group_fn(fn, sizes, dtype, num_sms):
    params = _params(fn)
    names = list(params)
    kw = {}
    if "num_sms" in params:
        kw["num_sms"] = num_sms
    if "dtype" in params:
        kw["dtype"] = dtype
    first = names[0] if names else ""
    if first in ("sizes", "shapes", "problems", "groups"):
        return fn(list(sizes), **kw)
    if first in ("M", "m"):  # a per-shape signature: describe the group by its largest member
        M = max(s[0] for s in sizes)
        N = max(s[1] for s in sizes)
        K = max(s[2] for s in sizes)
        return fn(M, N, K, **kw) if kw else fn(M, N, K, dtype, num_sms)
    return fn(list(sizes), **kw)


# --------------------------------------------------------------------------------------
# Ceilings
# --------------------------------------------------------------------------------------


def measure_ceilings(dtype="bf16", *, copy_bytes: int = 2 * 1024**3, gemm: tuple = (8192, 8192, 8192),
                     env: dict | None = None, device: str | None = None, timer: str = "auto",
                     warmup_ms: float = 25, rep_ms: float = 100) -> list[dict]:
    """Rows for the copy bandwidth (provider "copy", gbps = bytes read + written per second)
    and the cuBLAS GEMM rate (provider "torch.matmul", tflops) on this device. On the CPU
    the sizes shrink so that the code path stays testable."""
    import torch

    device = device or default_device()
    env = env or environment(device)
    dt = dtype_from_name(dtype)
    method = resolve_timer(timer, device)
    if method == "graph":
        # Captured in a CUDA graph, a device-to-device copy becomes a memcpy node run by the copy
        # engines: 2.7 TB/s on the H200 (2026-11-29) against 4.2-4.3 TB/s eagerly. The ceilings
        # are eager rates, so they are always timed with do_bench.
        method = "do_bench"
    if not device.startswith("cuda"):
        copy_bytes, gemm = min(copy_bytes, 64 * 1024**2), (256, 256, 256)
    out = []
    # copy: two source buffers rotated so the second read does not hit the L2
    n = copy_bytes // 4
    status, error, timing = "ok", "", None
    try:
        srcs = [torch.randn(n, device=device) for _ in range(2)]
        dst = torch.empty(n, device=device)
        timing = time_fn(rotating([lambda s=s: dst.copy_(s) for s in srcs]), method=method,
                         warmup_ms=warmup_ms, rep_ms=rep_ms)
        del srcs, dst
    except Exception as exc:  # noqa: BLE001
        status, error = classify(exc), _error_text(exc)
    out.append(R.make_row(suite="ceiling", shape=f"{copy_bytes}B", M=None, N=None, K=None, dtype="fp32",
                          provider="copy", config={"bytes_each_way": copy_bytes}, phase="final", status=status,
                          error=error, median_ms=timing.median_ms if timing else None,
                          p20_ms=timing.p20_ms if timing else None, p80_ms=timing.p80_ms if timing else None,
                          bytes_moved=2.0 * copy_bytes, timer=method, env=env))
    M, N, K = gemm
    status, error, timing, rel = "ok", "", None, None
    try:
        g = make_generator(device, 1234)
        a = random_matrix(M, K, dt, device, g)
        b = random_matrix(K, N, dt, device, g)
        c = torch.empty((M, N), dtype=dt, device=device)
        with tf32_for(dt):  # fp32: the tf32 rate, the one our schedules compete with
            timing = time_fn(lambda: torch.matmul(a, b, out=c), method=method, warmup_ms=warmup_ms, rep_ms=rep_ms)
        del a, b, c
    except Exception as exc:  # noqa: BLE001
        status, error = classify(exc), _error_text(exc)
    elt = torch.empty((), dtype=dt).element_size()
    out.append(R.make_row(suite="ceiling", shape=R.shape_text(M, N, K), M=M, N=N, K=K, dtype=dtype_name(dt),
                          provider="torch.matmul", config=torch_config(dt) or "", phase="final", status=status,
                          error=error,
                          median_ms=timing.median_ms if timing else None,
                          p20_ms=timing.p20_ms if timing else None, p80_ms=timing.p80_ms if timing else None,
                          flops=R.gemm_flops(M, N, K), bytes_moved=R.gemm_bytes(M, N, K, elt), rel_err=rel,
                          timer=method, env=env))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def copy_gbps(rows: Sequence[dict]) -> float | None:
    """The measured copy bandwidth (GB/s, read + write) among ceiling rows, if any."""
    for r in rows:
        if r.get("suite") == "ceiling" and r.get("provider") == "copy" and r.get("status") == "ok":
            v = r.get("gbps")
            if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
                return float(v)
    return None
