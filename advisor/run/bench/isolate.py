"""Run benchmark plans in child processes that survive crashed and hung kernels.

A kernel that reads out of bounds kills the whole CUDA context of its process, and a kernel
that deadlocks blocks the process in a CUDA call where no signal reaches Python. In one
process either would end a batch. Here the work runs in `python -m advisor.run.bench.worker`
children that stream events (one JSON line per variant start and per row) to a file; this
parent watches them and, when a child dies or goes silent for `stall_s`, kills its process
group, writes a failure row for the variant it was running (launch_error for a crash,
timeout for a hang) and starts a new child that skips everything already done.

`precompile` first runs N children in parallel that only warm Triton's on-disk kernel
cache (each takes every N-th variant), so the timed child mostly loads compiled kernels;
variants that failed to compile, crashed or hung there are passed to the timed run as known
outcomes and are not run again.

Only the standard library is used here: the parent never touches the GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import rows as R
from .runner import row_variant_key

DEFAULT_STALL_S = 120.0  # silence after which a child is presumed hung (> variant limit + a check)
STARTUP_S = 180.0  # importing torch/triton and creating a CUDA context, on a busy machine
POLL_S = 0.2
# Outcomes from the compile pass that the timed run takes as final: deterministic failures
# (the compile fails again; the launcher refuses again; the kernel faults again) and hangs.
KNOWN_STATUSES = ("compile_error", "skipped", "launch_error")


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def child_env(extra: dict | None = None) -> dict:
    """Environment for a worker: advisor importable from this checkout, output unbuffered."""
    env = dict(os.environ)
    root = str(_repo_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Child:
    """One worker process and the state read from its event file."""

    name: str
    argv: list
    events: Path
    log: Path
    proc: subprocess.Popen | None = None
    offset: int = 0
    started: float = 0.0
    last_event: float = 0.0
    hello: bool = False
    in_flight: dict | None = None
    killed_for: str = ""
    fatal: str = ""
    env_info: dict = field(default_factory=dict)

    def start(self, env: dict) -> None:
        self.events.parent.mkdir(parents=True, exist_ok=True)
        self.events.write_text("")
        self.offset = 0
        self.in_flight, self.killed_for, self.fatal, self.hello = None, "", "", False
        logf = open(self.log, "a")
        logf.write(f"\n==== {R.now_iso()} start {self.name}: {' '.join(map(str, self.argv))}\n")
        logf.flush()
        self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(_repo_root()), start_new_session=True)
        logf.close()
        self.started = self.last_event = time.monotonic()

    def read(self) -> list[dict]:
        """New complete event lines since the last read."""
        try:
            with self.events.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for line in data[: end + 1].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        if out:
            self.last_event = time.monotonic()
        for ev in out:
            t = ev.get("type")
            if t == "hello":
                self.hello = True
                self.env_info = ev.get("env") or {}
            elif t == "start":
                self.in_flight = ev
            elif t in ("row", "compiled"):
                key = ev.get("key") or (row_variant_key(ev["row"]) if t == "row" else None)
                if self.in_flight and key is not None and list(key) == list(self.in_flight.get("key") or []):
                    self.in_flight = None
            elif t in ("job_done", "job_start"):
                self.in_flight = None
            elif t == "fatal":
                self.fatal = ev.get("error", "")
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, reason: str) -> None:
        if self.alive():
            self.killed_for = reason
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
                pass

    def stalled(self, stall_s: float, startup_s: float) -> bool:
        limit = stall_s if self.hello else startup_s
        return time.monotonic() - self.last_event > limit

    def exit_text(self) -> str:
        rc = self.proc.returncode if self.proc else None
        if rc is None:
            return "still running"
        if rc < 0:
            try:
                return f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exit code {rc}"

    def log_tail(self, n: int = 3) -> str:
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(ln.strip() for ln in lines[-n:])


def _failure_row(stub: dict, status: str, error: str, env: dict) -> dict:
    return R.make_row(suite=stub.get("suite", ""), shape=stub.get("shape", ""), M=stub.get("M"), N=stub.get("N"),
                      K=stub.get("K"), dtype=stub.get("dtype", ""), provider=stub.get("provider", ""),
                      config=stub.get("config", ""), phase=stub.get("phase", "search"), status=status,
                      error=error, timer="", env=env)


def _worker_argv(plan_path: Path, events: Path, extra: list | None = None) -> list:
    return [sys.executable, "-m", "advisor.run.bench.worker", "--plan", str(plan_path), "--events", str(events)] + (
        extra or [])


def run_plan(plan: dict, workdir, *, log_path, on_row: Callable[[dict], None] | None = None,
             on_event: Callable[[dict], None] | None = None, stall_s: float = DEFAULT_STALL_S,
             startup_s: float = STARTUP_S, hard_deadline: float | None = None, max_restarts: int = 8,
             env_extra: dict | None = None) -> list[dict]:
    """Run `plan` (see worker.py) in a child, restarting past crashes and hangs; return all
    rows (also passed one by one to `on_row` as they arrive). `hard_deadline` (Unix time):
    the child is killed then and the variant it was running is recorded as a timeout."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    jobs = list(plan["jobs"])
    skip: dict[str, set] = {j["id"]: {tuple(k) for k in (plan.get("skip") or {}).get(j["id"], [])} for j in jobs}
    prior: dict[str, list] = {j["id"]: list((plan.get("prior_rows") or {}).get(j["id"], [])) for j in jobs}
    done: set[str] = set()
    crashes_without_progress: dict[str, int] = {}
    rows: list[dict] = []
    env_info: dict = {}
    hbm = plan.get("hbm_gbps")
    restarts = 0
    attempt = 0

    def add_row(jid, row):
        nonlocal hbm
        rows.append(row)
        prior.setdefault(jid, []).append(row)
        skip.setdefault(jid, set()).add(row_variant_key(row))
        if row.get("suite") == "ceiling" and row.get("provider") == "copy" and row.get("status") == "ok":
            hbm = row.get("gbps") or hbm
        if on_row:
            on_row(row)

    while True:
        remaining = [j for j in jobs if j["id"] not in done]
        if not remaining:
            break
        if hard_deadline is not None and time.time() >= hard_deadline:
            break
        attempt += 1
        sub = dict(plan, jobs=remaining, hbm_gbps=hbm,
                   skip={jid: [list(k) for k in ks] for jid, ks in skip.items() if ks},
                   prior_rows={jid: rs for jid, rs in prior.items() if rs})
        plan_path = workdir / f"plan-{attempt}.json"
        plan_path.write_text(json.dumps(sub, default=str))
        child = Child("measure", _worker_argv(plan_path, workdir / f"events-{attempt}.jsonl"),
                      workdir / f"events-{attempt}.jsonl", Path(log_path))
        child.start(child_env(env_extra))
        current_job = None
        progressed = False
        while True:
            for ev in child.read():
                t = ev.get("type")
                if t == "hello":
                    env_info = ev.get("env") or env_info
                elif t == "job_start":
                    current_job = ev.get("job")
                elif t == "row":
                    add_row(ev.get("job"), ev["row"])
                    progressed = True
                elif t == "job_done":
                    done.add(ev.get("job"))
                    progressed = True
                if on_event:
                    on_event(ev)
            if not child.alive():
                break
            if hard_deadline is not None and time.time() >= hard_deadline:
                child.kill("deadline")
                break
            if child.stalled(stall_s, startup_s):
                child.kill("hang")
                break
            time.sleep(POLL_S)
        child.kill(child.killed_for or "exit")
        for ev in child.read():  # what it wrote just before it ended
            t = ev.get("type")
            if t == "row":
                add_row(ev.get("job"), ev["row"])
                progressed = True
            elif t == "job_done":
                done.add(ev.get("job"))
            if on_event:
                on_event(ev)
        rc = child.proc.returncode
        if rc == 0 and not child.killed_for:
            remaining = [j for j in jobs if j["id"] not in done]
            if remaining:  # a clean exit that left jobs undone: do not spin on it
                for j in remaining:
                    done.add(j["id"])
            break
        why = child.exit_text() if not child.killed_for else {
            "hang": f"no progress for {stall_s:.0f} s (hung kernel?), killed",
            "deadline": "run deadline reached, killed"}[child.killed_for]
        tail = child.fatal or child.log_tail()
        if child.in_flight:
            stub = child.in_flight.get("stub") or {}
            jid = child.in_flight.get("job")
            status = "timeout" if child.killed_for in ("hang", "deadline") else "launch_error"
            add_row(jid, _failure_row(stub, status, f"worker {why}; last output: {tail}", env_info))
            progressed = True
        elif current_job is not None and current_job not in done:
            n = crashes_without_progress.get(current_job, 0) + (0 if progressed else 1)
            crashes_without_progress[current_job] = n
            if n >= 2 or child.killed_for == "deadline":
                job = next(j for j in jobs if j["id"] == current_job)
                from .worker import job_stub

                stub = job_stub(job, (job.get("suite", job["kind"]), "search", "(job)", ""))
                add_row(current_job, _failure_row(stub, "timeout" if child.killed_for else "launch_error",
                                                  f"worker {why} outside any variant; last output: {tail}",
                                                  env_info))
                done.add(current_job)
        elif not progressed:
            # died before starting any job (import error, no device): give up on the plan
            for j in remaining:
                stub = {"suite": j.get("suite", j["kind"]), "shape": j["id"], "provider": "(job)",
                        "dtype": j.get("dtype", "")}
                add_row(j["id"], _failure_row(stub, "launch_error", f"worker {why} before any job; last "
                                              f"output: {tail}", env_info))
                done.add(j["id"])
            break
        if child.killed_for == "deadline":
            break
        restarts += 1
        if restarts > max_restarts:
            break
    from .worker import job_stub

    for j in jobs:  # say what never ran, so a table shows it instead of silently lacking it
        if j["id"] not in done and not prior.get(j["id"]):
            stub = job_stub(j, (j.get("suite", j["kind"]), "search", "(job)", ""))
            why = ("the run's time limit was reached first" if hard_deadline is not None and time.time() >= hard_deadline
                   else f"the worker was restarted {restarts} times; giving up")
            add_row(j["id"], _failure_row(stub, "skipped", f"not run: {why}", env_info))
    return rows


def precompile(plan: dict, workdir, *, procs: int, deadline: float, log_dir=None,
               on_event: Callable[[dict], None] | None = None, stall_s: float = DEFAULT_STALL_S,
               startup_s: float = STARTUP_S, max_restarts: int = 4,
               env_extra: dict | None = None) -> tuple[dict, dict]:
    """Warm Triton's cache with `procs` children in parallel until done or `deadline`
    (Unix time). Returns (known, stats): known = {job id: [[key, status, error], ...]} for
    the timed run's plan, stats = counts of outcomes."""
    workdir = Path(workdir)
    log_dir = Path(log_dir or workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    known: dict[str, list] = {}
    stats = {"ok": 0, "failed": 0, "hung": 0, "crashed": 0}
    skips: dict[int, dict[str, set]] = {i: {} for i in range(procs)}
    children: dict[int, Child] = {}
    restarts = {i: 0 for i in range(procs)}
    env = child_env(env_extra)

    def spawn(i: int) -> None:
        sub = dict(plan, deadline=deadline,
                   skip={jid: [list(k) for k in ks] for jid, ks in skips[i].items()})
        p = workdir / f"compile-plan-{i}-{restarts[i]}.json"
        p.write_text(json.dumps(sub, default=str))
        ev_path = workdir / f"compile-events-{i}-{restarts[i]}.jsonl"
        c = Child(f"compile {i}/{procs}", _worker_argv(p, ev_path, ["--compile-slice", f"{i}/{procs}"]),
                  ev_path, log_dir / f"compile-{i}.log")
        c.start(env)
        children[i] = c

    def record(i: int, ev: dict) -> None:
        key = tuple(ev["key"])
        skips[i].setdefault(ev["job"], set()).add(key)
        status = ev.get("status")
        if status == "ok":
            stats["ok"] += 1
        else:
            stats["failed"] += 1
        if status in KNOWN_STATUSES:
            known.setdefault(ev["job"], []).append([list(key), status, f"(compile pass) {ev.get('error', '')}"])

    for i in range(procs):
        spawn(i)
    while children:
        for i, c in list(children.items()):
            for ev in c.read():
                if ev.get("type") == "compiled":
                    record(i, ev)
                if on_event:
                    on_event(ev)
            reason = ""
            if not c.alive():
                reason = "exit"
            elif time.time() >= deadline:
                reason = "deadline"
            elif c.stalled(stall_s, startup_s):
                reason = "hang"
            if not reason:
                continue
            c.kill(reason if reason != "exit" else "")
            for ev in c.read():
                if ev.get("type") == "compiled":
                    record(i, ev)
            del children[i]
            rc = c.proc.returncode
            if reason == "deadline" or (reason == "exit" and rc == 0):
                continue
            if c.in_flight:  # the variant that crashed or hung it: known, never run again
                key = tuple(c.in_flight["key"])
                jid = c.in_flight["job"]
                skips[i].setdefault(jid, set()).add(key)
                status = "timeout" if reason == "hang" else "launch_error"
                stats["hung" if reason == "hang" else "crashed"] += 1
                why = (f"hung for {stall_s:.0f} s in the compile pass (killed)" if reason == "hang"
                       else f"crashed the compile pass ({c.exit_text()}): {c.fatal or c.log_tail()}")
                known.setdefault(jid, []).append([list(key), status, why])
            restarts[i] += 1
            if restarts[i] <= max_restarts and time.time() < deadline - 5:
                spawn(i)
        time.sleep(POLL_S)
    return known, stats


def run_shape_isolated(M: int, N: int, K: int, dtype, strategies: dict, budget_s: float,
                       progress: Callable | None = None, *, suite: str = "adhoc",
                       baselines=("torch.matmul", "dp"), workdir=None, log_path=None,
                       variant_timeout_s: float = 45.0, stall_s: float | None = None, timer: str = "auto",
                       warmup_ms: float = 10, rep_ms: float = 50, schedule_files: dict | None = None,
                       hard_deadline: float | None = None) -> list[dict]:
    """runner.run_shape with the same arguments, run in a child process so that a kernel
    that faults or hangs costs one variant instead of the caller's process. `strategies`
    holds Config dataclasses (rebuilt from their JSON in the child) in the order to try;
    `progress` receives runner.Progress objects as rows arrive. `schedule_files` maps
    strategy ids to schedule files outside kernels/ (user copies, tests)."""
    import dataclasses

    dt = str(dtype).replace("torch.", "")
    dt = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}.get(dt, dt)
    configs = {name: [dataclasses.asdict(c) if dataclasses.is_dataclass(c) else c for c in cfgs]
               for name, cfgs in strategies.items()}
    job = {"id": f"{suite}/{M}x{N}x{K}/{dt}", "kind": "gemm", "suite": suite, "M": int(M), "N": int(N),
           "K": int(K), "dtype": dt, "strategies": list(strategies), "configs": configs, "budget_s": budget_s,
           "baselines": list(baselines)}
    return _run_one_job(job, R.shape_text(M, N, K), budget_s, progress, workdir=workdir, log_path=log_path,
                        variant_timeout_s=variant_timeout_s, stall_s=stall_s, timer=timer, warmup_ms=warmup_ms,
                        rep_ms=rep_ms, schedule_files=schedule_files, hard_deadline=hard_deadline)


def _run_one_job(job: dict, label: str, budget_s: float, progress: Callable | None, *, workdir, log_path,
                 variant_timeout_s: float, stall_s: float | None, timer: str, warmup_ms: float, rep_ms: float,
                 schedule_files: dict | None, hard_deadline: float | None) -> list[dict]:
    """One job's plan run in the child, its events turned into runner.Progress for `progress`
    (under `label`) as variants start and rows arrive."""
    import tempfile

    from .runner import Progress

    plan = {"run_id": R.new_run_id(), "deadline": None, "hbm_gbps": None, "jobs": [job],
            "settings": {"timer": timer, "warmup_ms": warmup_ms, "rep_ms": rep_ms,
                         "variant_timeout_s": variant_timeout_s},
            "schedules": {k: str(v) for k, v in (schedule_files or {}).items()}}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="advisor-bench-"))
    t0 = time.monotonic()
    count = {"n": 0}

    def on_event(ev):
        if progress is not None and ev.get("type") == "start":
            count["n"] += 1
            key = ev.get("key") or ["", "", "", ""]
            progress(Progress(label, key[2], key[3], key[1], count["n"], 0, time.monotonic() - t0, budget_s))

    def on_row(r):  # rows from the child and failure rows written here for a dead child
        if progress is not None:
            progress(Progress(label, r.get("provider", ""), r.get("config", ""), r.get("phase", ""), count["n"], 0,
                              time.monotonic() - t0, budget_s, r))

    return run_plan(plan, workdir, log_path=log_path or workdir / "worker.log", on_event=on_event, on_row=on_row,
                    stall_s=stall_s or variant_timeout_s + 30, hard_deadline=hard_deadline)


def run_group_isolated(sizes, dtype: str, budget_s: float, progress: Callable | None = None, *,
                       suite: str = "adhoc", label: str | None = None, workdir=None, log_path=None,
                       variant_timeout_s: float = 45.0, stall_s: float | None = None, timer: str = "auto",
                       warmup_ms: float = 10, rep_ms: float = 50, schedule_files: dict | None = None,
                       hard_deadline: float | None = None) -> list[dict]:
    """grouped.run_grouped on the GEMMs `sizes` ([(M, N, K), ...]) in a child process, as
    run_shape_isolated does for one shape: the torch.matmul loop, its CUDA graph,
    torch._grouped_mm where it applies, then our grouped schedule's search space."""
    sizes = [[int(x) for x in s] for s in sizes]
    label = label or f"{len(sizes)} GEMMs"
    job = {"id": f"{suite}/{label}/{dtype}", "kind": "grouped", "suite": suite, "dtype": dtype, "sizes": sizes,
           "label": label, "budget_s": budget_s}
    return _run_one_job(job, label, budget_s, progress, workdir=workdir, log_path=log_path,
                        variant_timeout_s=variant_timeout_s, stall_s=stall_s, timer=timer, warmup_ms=warmup_ms,
                        rep_ms=rep_ms, schedule_files=schedule_files, hard_deadline=hard_deadline)
