"""Find the data directories that ship with advisor.

In a checkout they sit at the repository root (`rules/`, `templates/`, `kernels/`); in an
installed wheel they are copied under `advisor/_data/` (see pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"advisor data directory {name!r} is missing from this install")


def rules_dir() -> Path:
    return data_dir("rules")


def templates_dir() -> Path:
    return data_dir("templates")


def kernels_dir() -> Path:
    return data_dir("kernels")


def examples_dir() -> Path:
    return _PKG / "examples"
