"""experiments/probe_wide_tile.py's two-dot kernel (a BM x (BN0 + BN1) tile) is correct on odd
shapes under the CPU interpreter, so its H200 timings compare a right answer."""

from __future__ import annotations

from conftest import load_script

probe_wide_tile = load_script("experiments/probe_wide_tile.py")


def test_two_dot_tile_matches_float64():
    assert probe_wide_tile.check_cpu() == 0
