"""`advisor profile`: Nsight Systems when found (a stand-in nsys here), else the PyTorch
profiler for Python programs, else a clear error."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA

from advisor.cli import cli
from advisor.run.profile import _python_argv

# A stand-in nsys: `profile ... -o BASE CMD...` runs CMD and writes BASE.nsys-rep (the real
# report magic); `export ... -o OUT REP` writes a real H200 SQLite export to OUT.
FAKE_NSYS = r"""#!/bin/sh
echo "$@" >> "$FAKE_NSYS_LOG"
verb=$1; shift
out=""; while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2;;
    -t|-s|-f|--type) shift 2;;
    --*) shift;;
    *) break;;
  esac
done
if [ "$verb" = profile ]; then
  "$@"; rc=$?
  printf 'NVIDIA Tegra Profiler Report\000fake' > "$out.nsys-rep"
  exit $rc
fi
gunzip -c "$FAKE_NSYS_SQLITE" > "$out"
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nsys"
    script.write_text(FAKE_NSYS)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NSYS", str(script))
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "nsys.log"))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(DATA / "h200" / "tail.sqlite.gz"))
    return tmp_path / "nsys.log"


def test_profile_with_nsys_then_diagnose(tmp_path, fake_nsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran.txt"
    r = CliRunner().invoke(cli, ["profile", "--out", "prof", "--", "sh", "-c", f"echo hi > {marker}"])
    assert r.exit_code == 0, r.output
    assert marker.read_text().strip() == "hi"  # the user's command really ran
    log = fake_nsys.read_text()
    assert "profile -t cuda,nvtx -s none --cpuctxsw=none" in log and "export" in log
    assert "tail_wave" in r.output  # the exported H200 trace was diagnosed
    assert (tmp_path / "prof" / "report.md").is_file() and (tmp_path / "prof" / "report.json").is_file()


def test_profile_without_nsys_non_python_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NSYS", raising=False)
    import advisor.run.profile as prof

    monkeypatch.setattr(prof, "find_nsys", lambda: None)
    r = CliRunner().invoke(cli, ["profile", "--out", str(tmp_path / "p"), "--", "./my_cuda_app", "--n", "3"])
    assert r.exit_code == 2
    assert "nsys not found and the command is not a Python program" in r.output
    assert "Traceback" not in r.output


def test_profile_kineto_records_a_python_program(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("import sys, torch\nprint(torch.ones(3).sum().item())\nsys.exit(3)\n")
    r = CliRunner().invoke(cli, ["profile", "--kineto", "--out", "k", "--", "python", "prog.py"])
    # The CPU build of torch records no GPU kernels: a one-line error after the trace is written.
    assert r.exit_code == 2 and "no GPU kernel activity" in r.output
    with gzip.open(tmp_path / "k" / "profile.json.gz", "rt") as fh:
        assert '"traceEvents"' in fh.read()


@pytest.mark.slow
def test_profile_kineto_runs_python_c(tmp_path, monkeypatch):
    # `python -c CODE` is code, not a script path: it runs, sees argv[0] == "-c", and its
    # exit code comes back (it was read as a file name: FileNotFoundError, exit code 1)
    monkeypatch.chdir(tmp_path)
    code = "import sys; open('ran.txt', 'w').write(' '.join(sys.argv)); sys.exit(3)"
    r = CliRunner().invoke(cli, ["profile", "--kineto", "--out", "k", "--", "python", "-c", code, "a1"])
    assert (tmp_path / "ran.txt").read_text() == "-c a1"
    assert "exited with code 3" in r.output and "FileNotFoundError" not in r.output
    assert (tmp_path / "k" / "profile.json.gz").is_file()


def test_python_argv():
    assert _python_argv(["python3", "-u", "train.py", "--x"]) == ["train.py", "--x"]
    assert _python_argv(["python3", "-u", "-c", "print(1)", "a"]) == ["-c", "print(1)", "a"]
    assert _python_argv(["python", "-X", "dev", "-m", "pkg.mod", "a"]) == ["-m", "pkg.mod", "a"]
    assert _python_argv(["bench.py"]) == ["bench.py"]
    assert _python_argv(["./a.out"]) is None
    assert _python_argv(["python"]) is None
