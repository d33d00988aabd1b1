"""The child process of advisor.run.bench.isolate: runs a plan's jobs and streams events.

    python -m advisor.run.bench.worker --plan PLAN.json --events EVENTS.jsonl [--compile-slice I/N]

Events are JSON lines appended (and flushed) to EVENTS as they happen, so the parent keeps
everything up to the moment a crash or a hang stops this process:

    {"type": "hello", "env": {...}}                 started; device and versions
    {"type": "job_start", "job": ID}
    {"type": "start", "job": ID, "key": [...], "stub": {...}}   a variant is about to run
    {"type": "row", "job": ID, "row": {...}}        a measurement (or failure) row
    {"type": "compiled", "job": ID, "key": [...], "status": S, "error": E, "seconds": T}
    {"type": "job_done", "job": ID}
    {"type": "device_lost", "error": E}             the CUDA context died: exit code 3
    {"type": "bye"}

Plan (JSON): {"run_id", "deadline" (Unix time or null), "hbm_gbps", "settings": {...},
"jobs": [...], "skip": {job: [key, ...]}, "known": {job: [[key, status, error], ...]},
"prior_rows": {job: [row, ...]}, "schedules": {strategy: "path/to/file.py"}}. Job kinds:
"ceiling", "gemm" (suite, M, N, K, dtype, strategies, budget_s; optional baselines, and
configs = {strategy: [Config as a dict, ...]} to use a caller's ranked list instead of the
schedule's search space) and "grouped" (suite, dtype, count, lo, hi, seed, budget_s; or sizes = [[M, N, K], ...] and
an optional label instead of the seeded draw). See bench/bench_gemm.py for a full example.

With --compile-slice I/N the worker only warms Triton's on-disk cache: it takes every N-th
variant of the whole plan, starting at I, in priority order, runs it once on its real
shape (same dtype, strides and specialization as the timed run, so the timed run finds the
compiled kernel) and reports how that went. Several such workers run in parallel before the
timed run so that compile time, which dominates a short budget, is spent on many CPU cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

EXIT_DEVICE_LOST = 3


class Events:
    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)

    def emit(self, **event) -> None:
        self.f.write(json.dumps(_jsonable(event)) + "\n")
        self.f.flush()


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _load_file_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"advisor_bench_user_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_schedules(plan: dict) -> dict:
    """Strategy modules given by file path in the plan (tests, user copies); others come
    from kernel_lib when first used."""
    out = {}
    for name, path in (plan.get("schedules") or {}).items():
        out[name] = _load_file_module(name, path)
    return out


def job_stub(job: dict, key) -> dict:
    """The identifying columns of a row for variant `key` of `job` (used by the parent to
    write a failure row when this process dies during that variant)."""
    suite, phase, provider, config = key
    if job["kind"] == "gemm":
        from .rows import shape_text

        shape, M, N, K = shape_text(job["M"], job["N"], job["K"]), job["M"], job["N"], job["K"]
    elif job["kind"] == "grouped":
        from .grouped import job_label

        shape, M, N, K = job_label(job), None, None, None
    else:
        shape, M, N, K = job.get("id", ""), None, None, None
    return {"suite": suite, "phase": phase, "provider": provider, "config": config, "shape": shape,
            "M": M, "N": N, "K": K, "dtype": job.get("dtype", "")}


def _keys(items) -> set:
    return {tuple(k) for k in items or []}


def _known(items) -> dict:
    return {tuple(k): (s, e) for k, s, e in items or []}


def job_budget(job: dict, deadline: float | None, remaining_jobs: int) -> float:
    """The job's budget, shrunk to a fair share of the time left before the deadline."""
    budget = float(job.get("budget_s", 30.0))
    if deadline is None:
        return budget
    left = deadline - time.time()
    return max(0.0, min(budget, left / max(1, remaining_jobs)))


def rebuild_config(module, data):
    """A schedule's Config from its JSON form (dataclasses.asdict): lists back to tuples."""
    if data is None or data == "":
        return None
    if isinstance(data, str):
        data = json.loads(data)
    fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return module.Config(**fixed)


def gemm_candidates(job: dict, schedules: dict, num_sms: int, settings: dict) -> dict:
    """{strategy: ordered configs} for a gemm job (default config first, then the search
    space ranked by the analytical model unless settings["order"] == "space", truncated to
    max_configs); a strategy whose file cannot give configs maps to the
    exception, which run_shape then records."""
    from .runner import candidate_configs, load_schedule, model_order

    out = {}
    given = job.get("configs")
    for name in job.get("strategies", []):
        mod = load_schedule(name, schedules)
        if given is not None:  # the caller ranked them already: keep its order
            out[name] = [rebuild_config(mod, d) for d in given.get(name, [])]
            continue
        cfgs = candidate_configs(mod, job["M"], job["N"], job["K"], job["dtype"], num_sms,
                                 quick=settings.get("quick", False))
        if settings.get("order", "model") == "model":
            cfgs = model_order(name, cfgs, job["M"], job["N"], job["K"], job["dtype"], num_sms)
        max_configs = settings.get("max_configs")
        out[name] = cfgs[:max_configs] if max_configs else cfgs
    return out


def _measure(plan: dict, ev: Events) -> int:
    from . import runner
    from .grouped import grouped_candidates, job_label, job_sizes, measure_ceilings, run_grouped

    settings = plan.get("settings", {})
    device = runner.default_device()
    env = runner.environment(device, plan.get("run_id"))
    ev.emit(type="hello", env=env, pid=os.getpid())
    schedules = load_schedules(plan)
    deadline = plan.get("deadline")
    hbm = plan.get("hbm_gbps")
    jobs = plan["jobs"]
    common = dict(variant_timeout_s=settings.get("variant_timeout_s", runner.DEFAULT_VARIANT_TIMEOUT_S),
                  timer=settings.get("timer", "auto"), warmup_ms=settings.get("warmup_ms", 10),
                  rep_ms=settings.get("rep_ms", 50), cpu_reps=settings.get("cpu_reps", 3),
                  final=settings.get("final", True), env=env, device=device)
    for n, job in enumerate(jobs):
        jid = job["id"]
        ev.emit(type="job_start", job=jid)
        emitted: set[int] = set()

        def emit_row(row, jid=jid, emitted=emitted):
            if id(row) not in emitted:
                emitted.add(id(row))
                ev.emit(type="row", job=jid, row=row)

        def progress(p, emit_row=emit_row):
            if p.row is not None:
                emit_row(p.row)

        def on_start(key, job=job, jid=jid):
            ev.emit(type="start", job=jid, key=list(key), stub=job_stub(job, key))

        resume = dict(skip=_keys(plan.get("skip", {}).get(jid)), known=_known(plan.get("known", {}).get(jid)),
                      prior_rows=plan.get("prior_rows", {}).get(jid, []), on_start=on_start)
        budget = job_budget(job, deadline, len(jobs) - n)
        try:
            if job["kind"] == "ceiling":
                key = ("ceiling", "final", "copy+torch.matmul", "")
                rows = []
                if key not in resume["skip"]:  # after a crash here, the ceilings are not retried
                    on_start(key)
                    rows = measure_ceilings(job.get("dtype", "bf16"), env=env, device=device,
                                            timer=settings.get("timer", "auto"))
                from .grouped import copy_gbps

                hbm = copy_gbps(rows) or hbm
            elif job["kind"] == "gemm":
                try:
                    strategies = gemm_candidates(job, schedules, int(env["sm_count"]), settings)
                    bad = {}
                except Exception:  # noqa: BLE001 - build per strategy so one bad file spares the rest
                    strategies, bad = {}, {}
                    for name in job.get("strategies", []):
                        try:
                            strategies.update(gemm_candidates(dict(job, strategies=[name]), schedules,
                                                              int(env["sm_count"]), settings))
                        except Exception as exc:  # noqa: BLE001
                            bad[name] = exc
                rows = runner.run_shape(
                    job["M"], job["N"], job["K"], job["dtype"], strategies, budget, progress,
                    suite=job["suite"], schedules=schedules, hbm_gbps=hbm, seed=job.get("check_seed"),
                    dp_max_configs=settings.get("dp_max_configs", runner.DEFAULT_DP_CONFIGS),
                    dp_share=settings.get("dp_share", runner.DEFAULT_DP_SHARE),
                    extra_timers=job.get("extra_timers", ()),
                    baselines=tuple(job.get("baselines", (runner.BASELINE_TORCH, runner.BASELINE_DP))),
                    **resume, **common)
                from .rows import make_row, shape_text

                for name, exc in bad.items():
                    if runner.variant_key(job["suite"], "search", name, "") in resume["skip"]:
                        continue
                    rows.append(make_row(
                        suite=job["suite"], shape=shape_text(job["M"], job["N"], job["K"]), M=job["M"],
                        N=job["N"], K=job["K"], dtype=job["dtype"], provider=name,
                        status="skipped" if isinstance(exc, ImportError) else "compile_error",
                        error=f"no candidates: {runner._error_text(exc)}", timer="", env=env))
            elif job["kind"] == "grouped":
                sizes = job_sizes(job)
                module = schedules.get("grouped")
                configs = None
                try:
                    module = module or runner.load_schedule("grouped")
                    configs = grouped_candidates(module, sizes, job["dtype"], int(env["sm_count"]),
                                                 max_configs=settings.get("max_configs"),
                                                 quick=settings.get("quick", False))
                except Exception:  # noqa: BLE001 - run_grouped records the missing schedule
                    module = None
                rows = run_grouped(sizes, job["dtype"], configs, budget, progress, suite=job["suite"],
                                   label=job_label(job),
                                   module=module, seed=job.get("check_seed"), **resume, **common)
            else:
                raise ValueError(f"unknown job kind {job['kind']!r}")
        except runner.DeviceLost as exc:
            for r in exc.rows:
                emit_row(r)
            ev.emit(type="device_lost", error=str(exc))
            return EXIT_DEVICE_LOST
        for r in rows:
            emit_row(r)
        ev.emit(type="job_done", job=jid)
    ev.emit(type="bye")
    return 0


def compile_items(plan: dict, schedules: dict, num_sms: int) -> list[tuple[dict, object, object, tuple]]:
    """Every (job, strategy, config, key) of the plan's GEMM and grouped jobs, in priority
    order: each job's first candidates before anyone's later ones."""
    from . import runner
    from .grouped import grouped_candidates, job_sizes

    settings = plan.get("settings", {})
    ranked = []
    for jn, job in enumerate(plan["jobs"]):
        items = []
        if job["kind"] == "gemm":
            lists = {}
            try:
                if runner.BASELINE_DP not in job.get("baselines", (runner.BASELINE_DP,)):
                    raise LookupError("no dp baseline in this job")
                dp = runner.load_schedule("dp", schedules)
                lists["dp"] = runner.dp_candidates(dp, job["M"], job["N"], job["K"], job["dtype"], num_sms,
                                                   settings.get("dp_max_configs", runner.DEFAULT_DP_CONFIGS))
            except Exception:  # noqa: BLE001 - the timed run records it
                pass
            for name in job.get("strategies", []):
                try:
                    lists.update(gemm_candidates(dict(job, strategies=[name]), schedules, num_sms, settings))
                except Exception:  # noqa: BLE001
                    pass
            items = [(name, c) for name, _, c in runner._round_robin(lists)]
        elif job["kind"] == "grouped":
            try:
                mod = schedules.get("grouped") or runner.load_schedule("grouped")
                sizes = job_sizes(job)
                items = [("grouped", c) for c in grouped_candidates(
                    mod, sizes, job["dtype"], num_sms, max_configs=settings.get("max_configs"),
                    quick=settings.get("quick", False))]
            except Exception:  # noqa: BLE001
                items = []
        for rank, (name, cfg) in enumerate(items):
            from .rows import config_json

            key = runner.variant_key(job.get("suite", ""), "search", name, config_json(cfg))
            ranked.append((rank, jn, job, name, cfg, key))
    ranked.sort(key=lambda t: (t[0], t[1]))
    return [(job, name, cfg, key) for _, _, job, name, cfg, key in ranked]


def _compile(plan: dict, ev: Events, index: int, count: int) -> int:
    import torch

    from . import runner
    from .grouped import job_sizes, schedule_setup
    from .verify import dtype_from_name, make_generator, random_matrix

    settings = plan.get("settings", {})
    device = runner.default_device()
    env = runner.environment(device, plan.get("run_id"))
    ev.emit(type="hello", env=env, pid=os.getpid())
    schedules = load_schedules(plan)
    items = compile_items(plan, schedules, int(env["sm_count"]))[index::count]
    skip = {jid: _keys(keys) for jid, keys in (plan.get("skip") or {}).items()}
    limit = settings.get("variant_timeout_s", runner.DEFAULT_VARIANT_TIMEOUT_S)
    inputs: dict[str, tuple] = {}
    for job, name, cfg, key in items:
        jid = job["id"]
        if key in skip.get(jid, set()):
            continue
        deadline = plan.get("deadline")
        if deadline is not None and time.time() > deadline:
            break
        ev.emit(type="start", job=jid, key=list(key), stub=job_stub(job, key))
        t0 = time.perf_counter()
        status, error = "ok", ""
        try:
            with runner.time_limit(limit):
                mod = runner.load_schedule(name, schedules)
                dt = dtype_from_name(job["dtype"])
                if job["kind"] == "gemm":
                    if jid not in inputs:
                        inputs.clear()
                        g = make_generator(device, 5)
                        inputs[jid] = (random_matrix(job["M"], job["K"], dt, device, g),
                                       random_matrix(job["K"], job["N"], dt, device, g),
                                       torch.empty((job["M"], job["N"]), dtype=dt, device=device))
                    a, b, o = inputs[jid]
                    runner.schedule_call(mod, cfg)(a, b, o)
                else:
                    if jid not in inputs:
                        inputs.clear()
                        g = make_generator(device, 5)
                        sizes = job_sizes(job)
                        inputs[jid] = ([random_matrix(m, k, dt, device, g) for m, n, k in sizes],
                                       [random_matrix(k, n, dt, device, g) for m, n, k in sizes],
                                       [torch.empty((m, n), dtype=dt, device=device) for m, n, k in sizes])
                    As, Bs, outs = inputs[jid]
                    run, _ = schedule_setup(mod, cfg)(As, Bs, outs)
                    run()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
        except runner.VariantTimeout as exc:
            status, error = "timeout", str(exc)
        except Exception as exc:  # noqa: BLE001
            status, error = runner.classify(exc), runner._error_text(exc)
        ev.emit(type="compiled", job=jid, key=list(key), status=status, error=error,
                seconds=time.perf_counter() - t0)
        if status != "ok" and not runner.device_healthy():
            ev.emit(type="device_lost", error=error)
            return EXIT_DEVICE_LOST
    ev.emit(type="bye")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m advisor.run.bench.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--events", required=True)
    ap.add_argument("--compile-slice", default=None, help="I/N: warm the compile cache for every N-th variant")
    args = ap.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    ev = Events(args.events)
    try:
        if args.compile_slice:
            i, n = (int(x) for x in args.compile_slice.split("/"))
            return _compile(plan, ev, i, n)
        return _measure(plan, ev)
    except Exception as exc:  # noqa: BLE001 - report, then die with a distinct code
        traceback.print_exc()
        ev.emit(type="fatal", error=f"{type(exc).__name__}: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
