"""Write a finished torch.profiler run as a gzipped Kineto trace (the workloads' shared exit)."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path


def export_gz(prof, path: Path) -> Path:
    """Export `prof` to PATH.gz (PATH ends in .json): Chrome-trace JSON, gzip level 9."""
    prof.export_chrome_trace(str(path))
    with open(path, "rb") as src, gzip.open(f"{path}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    return Path(f"{path}.gz")
