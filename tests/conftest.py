"""Shared test setup.

Tests run on the CPU: Triton kernels execute under the interpreter (TRITON_INTERPRET=1 must
be set before triton is imported, hence here), with a small SM count so persistent and
Stream-K schedules really loop over several tiles. Set ADVISOR_TEST_GPU=1 to run the kernel
tests on a real GPU instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

if os.environ.get("ADVISOR_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("ADVISOR_NUM_SMS", "3")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def load_script(relpath: str) -> ModuleType:
    """A script of bench/ or experiments/ (folders of scripts, not packages) as a module,
    without putting its folder on sys.path for every later import."""
    path = REPO / relpath
    name = "_script_" + relpath.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


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
