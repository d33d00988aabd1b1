"""experiments/check_schedules.py (the GPU check of every schedule after a kernels/ change) in
its CPU smoke mode: every case it runs on the interpreter is right, and it writes its files."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
@pytest.mark.interpreter
def test_check_schedules_smoke_run_on_the_interpreter(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, str(REPO / "experiments" / "check_schedules.py"), "--device", "cpu", "--tiny",
                        "--out", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "check_schedules.csv")))
    checks = [x for x in rows if x["kind"] == "check"]
    cases = {x["case"].split()[0] for x in checks}
    assert {"dp", "split_k", "persistent", "stream_k", "warp_specialization", "grouped"} <= cases
    assert all(x["status"] == "ok" for x in checks), [x for x in checks if x["status"] != "ok"][:3]
    assert {x["case"].split()[1] for x in rows if x["kind"] == "variant"} == {
        "dp", "split_k", "persistent", "stream_k", "warp_specialization"}
    assert "0 failures" in (tmp_path / "check_schedules.md").read_text()
