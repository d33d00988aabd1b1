"""bench/probe_wide_tile.py's two-dot kernel (a BM x (BN0 + BN1) tile) is correct on odd
shapes under the CPU interpreter, so its H200 timings compare a right answer."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import probe_wide_tile  # bench/ is not a package


def test_two_dot_tile_matches_float64():
    assert probe_wide_tile.check_cpu() == 0
