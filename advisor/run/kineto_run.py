"""Run a Python script or module under the PyTorch profiler and write a Kineto trace.

    python -m advisor.run.kineto_run --out trace.json.gz -- train.py --epochs 1
    python -m advisor.run.kineto_run --out trace.json.gz -- -m mypkg.bench
    python -m advisor.run.kineto_run --out trace.json.gz -- -c "import mypkg; mypkg.run()"

CPU and CUDA activity are recorded with input shapes (so GEMM shapes reach the diagnosis).
The trace is written even if the program raises or calls sys.exit; the program's exit code
is passed on.
"""

from __future__ import annotations

import argparse
import gzip
import os
import runpy
import shutil
import sys
import tempfile
import traceback
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m advisor.run.kineto_run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="Trace file to write (.json or .json.gz).")
    p.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args], -m module [args] or -c code [args], after --")
    args = p.parse_args(argv)
    prog = [a for a in args.program]
    if prog and prog[0] == "--":
        prog = prog[1:]
    if not prog:
        p.error("no program given")
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        print("advisor: error: the PyTorch profiler needs torch installed", file=sys.stderr)
        return 2
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    rc = 0
    old_argv = sys.argv
    with profile(activities=activities, record_shapes=True) as prof:
        try:
            if prog[0] in ("-m", "-c") and len(prog) < 2:
                p.error(f"{prog[0]} needs {'a module name' if prog[0] == '-m' else 'the code to run'}")
            if prog[0] == "-m":
                sys.argv = [prog[1], *prog[2:]]
                runpy.run_module(prog[1], run_name="__main__", alter_sys=True)
            elif prog[0] == "-c":  # as `python -c`: argv[0] is "-c", the code runs as __main__
                sys.argv = ["-c", *prog[2:]]
                exec(compile(prog[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102 (the user asked to run it)
            else:
                sys.argv = list(prog)
                sys.path.insert(0, str(Path(prog[0]).resolve().parent))
                runpy.run_path(prog[0], run_name="__main__")
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # the program failed: report it, still write what was recorded
            traceback.print_exc()
            rc = 1
        finally:
            sys.argv = old_argv
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        if args.out.name.endswith(".gz"):
            with open(raw, "rb") as src, gzip.open(args.out, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(raw, args.out)
    print(f"advisor: wrote {args.out}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
