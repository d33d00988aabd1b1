"""experiments/probe_read_floor.py's streaming read sums every element of an odd-length buffer
(interpreter), so its H200 timings are of a kernel that really reads all the bytes."""

from __future__ import annotations

import pytest
from conftest import load_script

probe_read_floor = load_script("experiments/probe_read_floor.py")

pytestmark = pytest.mark.interpreter


def test_read_kernel_sums_everything():
    assert probe_read_floor.check_cpu() == 0
