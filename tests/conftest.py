"""Shared test setup.

Tests run on the CPU: Triton kernels execute under the interpreter (TRITON_INTERPRET=1 must
be set before triton is imported, hence here), with a small SM count so persistent and
Stream-K schedules really loop over several tiles. Set ADVISOR_TEST_GPU=1 to run the kernel
tests on a real GPU instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("ADVISOR_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("ADVISOR_NUM_SMS", "3")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def corpus_dir() -> Path:
    """../shared/corpus beside the checkout (ADVISOR_CORPUS overrides)."""
    env = os.environ.get("ADVISOR_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


@pytest.fixture
def corpus() -> Path:
    path = corpus_dir()
    if not path.is_dir():
        pytest.skip(f"reference corpus not found at {path}")
    return path
