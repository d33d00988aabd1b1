"""Run a program under a profiler and return the trace it wrote.

Nsight Systems when `nsys` is found (PATH, $NSYS, standard install dirs): CUDA and NVTX
tracing, no CPU sampling, exported to SQLite in the output directory. Otherwise, for a
Python program, the PyTorch profiler (Kineto JSON, shapes recorded) through
`python -m advisor.run.kineto_run`. Anything else gets a clear error saying what to install.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import AdvisorError
from ..traces.nsys_rep import export_sqlite, find_nsys

NSYS_ARGS = ["profile", "-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none", "-f", "true"]


@dataclass
class Profiled:
    tool: str  # "nsys" | "kineto"
    trace: Path  # the file to diagnose
    report: Path | None  # the .nsys-rep, when nsys ran
    returncode: int


def _python_argv(command: Sequence[str]) -> list[str] | None:
    """The script, module or code part of a Python command line (`python x.py a`, `x.py a`,
    `python -m pkg a`, `python -c CODE a`), or None when the command is not Python."""
    if not command:
        return None
    first = Path(command[0]).name
    if first.startswith("python"):
        rest = list(command[1:])
        # Skip interpreter flags such as -u, -O, -X dev (but keep -m and -c).
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            flag = rest.pop(0)
            if flag in ("-X", "-W") and rest:
                rest.pop(0)
        return rest or None
    if command[0].endswith(".py"):
        return list(command)
    return None


def profile(
    command: Sequence[str],
    out_dir: Path,
    *,
    prefer: str = "auto",
    name: str = "profile",
    log: Callable[[str], None] = lambda msg: None,
    env: dict[str, str] | None = None,
) -> Profiled:
    """Profile `command`, writing into `out_dir`. `prefer` is "auto", "nsys" or "kineto";
    `env` replaces the environment of the profiled program (advisor.run.use.routing_env)."""
    if not command:
        raise AdvisorError("no command to profile: put it after --, e.g. advisor profile -- python train.py")
    out_dir.mkdir(parents=True, exist_ok=True)
    nsys = find_nsys() if prefer in ("auto", "nsys") else None
    if prefer == "nsys" and nsys is None:
        raise AdvisorError("--nsys asked for, but nsys was not found on PATH, $NSYS or the standard install dirs")
    if nsys:
        rep = out_dir / f"{name}.nsys-rep"
        argv = [nsys, *NSYS_ARGS, "-o", str(out_dir / name), *command]
        log(f"profiling with Nsight Systems: {shlex.join(argv)}")
        try:
            rc = subprocess.call(argv, env=env)
        except OSError as exc:
            raise AdvisorError(f"could not start nsys ({exc.strerror})") from None
        if not rep.is_file():
            raise AdvisorError(f"nsys wrote no report (exit code {rc}); see its output above")
        log("exporting the report to SQLite")
        sqlite = export_sqlite(rep, out_dir)
        return Profiled("nsys", sqlite, rep, rc)
    py = _python_argv(command)
    if py is None:
        raise AdvisorError(
            "nsys not found and the command is not a Python program: install Nsight Systems "
            "(or set $NSYS), or profile a Python program to use the PyTorch profiler"
        )
    trace = out_dir / f"{name}.json.gz"
    argv = [sys.executable, "-m", "advisor.run.kineto_run", "--out", str(trace), "--", *py]
    log(f"nsys not found: profiling with the PyTorch profiler: {shlex.join(argv)}")
    env = dict(os.environ if env is None else env)
    try:
        rc = subprocess.call(argv, env=env)
    except OSError as exc:
        raise AdvisorError(f"could not start Python ({exc.strerror})") from None
    if not trace.is_file():
        raise AdvisorError(f"the PyTorch profiler wrote no trace (exit code {rc}); see the program's output above")
    return Profiled("kineto", trace, None, rc)
