"""Import the Triton schedules in `kernels/` wherever they were installed.

The folder is loaded as the package `advisor_kernels` from its file location, so it works in
a checkout and in a wheel alike, and cannot collide with an unrelated `kernels` package.
Importing a schedule needs torch and triton (the `gpu` extra).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from ..resources import kernels_dir

PACKAGE = "advisor_kernels"

# strategy id (the matrix's) -> schedule module
SCHEDULES = {
    "dp": "dp_gemm",
    "split_k": "split_k_gemm",
    "persistent": "persistent_gemm",
    "stream_k": "stream_k_gemm",
    "warp_specialization": "ws_gemm",
    "cluster_gemm": "gluon_gemm",  # Gluon, Triton >= 3.9: see advisor.run.loop.cluster_gemm_gate
    "grouped": "grouped_gemm",
    "comm_overlap": "comm_overlap",
    "split_kv": "split_kv_attention",
}


def _package() -> ModuleType:
    pkg = sys.modules.get(PACKAGE)
    if pkg is None:
        root = kernels_dir()
        spec = importlib.util.spec_from_file_location(
            PACKAGE, root / "__init__.py", submodule_search_locations=[str(root)]
        )
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = pkg
        spec.loader.exec_module(pkg)
    return pkg


def load(name: str) -> ModuleType:
    """A schedule module by file name ("split_k_gemm") or strategy id ("split_k")."""
    _package()
    module = SCHEDULES.get(name, name)
    return importlib.import_module(f"{PACKAGE}.{module}")


def source_path(name: str):
    return kernels_dir() / f"{SCHEDULES.get(name, name)}.py"
