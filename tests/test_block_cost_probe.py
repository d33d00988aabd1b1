"""experiments/block_cost.py, the probe behind rules/launch_overhead.toml's block_cost_ns, smoke-run
on the CPU under the Triton interpreter: both kernels check out and the CSV is long format."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_block_cost_probe_smoke(tmp_path):
    out = tmp_path / "bc.csv"
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, str(REPO / "experiments" / "block_cost.py"), "--tiny", "--device", "cpu",
                        "--reps", "1", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(out.open()))
    assert {x["metric"] for x in rows} == {"median_time", "block_cost", "saving_share"}
    assert {x["provider"] for x in rows} == {"one_tile", "grid_stride", "one_tile-grid_stride"}
    assert "ns/block/SM" in r.stdout
