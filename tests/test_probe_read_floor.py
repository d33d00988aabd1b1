"""bench/probe_read_floor.py's streaming read sums every element of an odd-length buffer
(interpreter), so its H200 timings are of a kernel that really reads all the bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import probe_read_floor  # bench/ is not a package

pytestmark = pytest.mark.interpreter


def test_read_kernel_sums_everything():
    assert probe_read_floor.check_cpu() == 0
