"""AMD conventions shared by the rocprof readers.

ROCm reports a dispatch's grid in work-items (HSA's AQL packet `grid_size`), not in
workgroups; the trace model wants workgroups (blocks), so each dimension becomes
ceil(grid / workgroup). A CU plays the SM's role; a wavefront (64 lanes on CDNA) the warp's.
Also the code the readers would otherwise repeat: a kernels/memcpy frame's common columns
(`gpu_frame`) and opening a SQLite file with their error wording (`readonly_db`).
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pandas as pd

from . import _sqlite


def workgroups(grid_items: pd.Series, wg_size: pd.Series) -> pd.Series:
    """ceil(grid_items / wg_size) per element, as Int64; <NA> where either is missing or the
    workgroup size is not positive."""
    g = pd.to_numeric(grid_items, errors="coerce").astype("Int64")
    w = pd.to_numeric(wg_size, errors="coerce").astype("Int64")
    w = w.where(w > 0)
    return (-((-g) // w)).astype("Int64")


def gpu_frame(
    rank: int,
    device_id: Any,
    stream_id: Any,
    correlation_id: Any,
    start: pd.Series,
    end: pd.Series,
    *,
    grid: Sequence[pd.Series] | None = None,
    block: Sequence[pd.Series] | None = None,
    **columns: Any,
) -> pd.DataFrame:
    """A kernels or memcpy frame: the columns every GPU record has (dur_ns = end - start), the
    launch geometry when `grid` (workgroups, x/y/z) and `block` (work-items per workgroup) are
    given, then `columns` as they are. Rows stay on the inputs' index."""
    data: dict[str, Any] = {
        "rank": rank,
        "device_id": device_id,
        "stream_id": stream_id,
        "correlation_id": correlation_id,
        "start_ns": start,
        "end_ns": end,
        "dur_ns": end - start,
    }
    if grid is not None and block is not None:
        gx, gy, gz = grid
        bx, by, bz = block
        data.update(
            grid_x=gx, grid_y=gy, grid_z=gz, block_x=bx, block_y=by, block_z=bz,
            grid_blocks=gx * gy * gz, block_threads=bx * by * bz,
        )
    data.update(columns)
    return pd.DataFrame(data)


@contextmanager
def readonly_db(path: Path, what: str = "corrupt SQLite file") -> Iterator[sqlite3.Connection]:
    """A read-only connection to the SQLite file at `path`, closed on leaving; a SQLite error
    (or an undecodable one: sqlite3 decodes its message, which may quote damaged schema text)
    inside the block becomes the one-line `_sqlite.db_error` saying `what`."""
    conn = _sqlite.open_readonly(path)
    try:
        yield conn
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise _sqlite.db_error(path, exc, what) from None
    finally:
        conn.close()


def copy_kind(kind: str, src_device: Any, dst_device: Any) -> str:
    """`kind` of a copy ("HtoD", "DtoD"...), made "PtoP" for a device-to-device copy between two
    different GPUs (src and dst device ids known and different): ROCm names such a copy
    MEMORY_COPY_DEVICE_TO_DEVICE, CUPTI (nsys, Kineto) calls it peer-to-peer, and a peer copy
    is communication (symmetric memory, copy-engine collectives), a same-GPU copy is not."""
    if kind != "DtoD" or src_device is None or dst_device is None or pd.isna(src_device) or pd.isna(dst_device):
        return kind
    return "PtoP" if src_device != dst_device else kind


def gfx_name(target_version: Any) -> str | None:
    """"gfx942" from rocprofiler-sdk's `gfx_target_version` 90402 (major*10000 + minor*100 +
    stepping, the stepping written in hex as in gfx90a); None for 0 or junk."""
    try:
        v = int(target_version)
    except (TypeError, ValueError, OverflowError):
        return None
    if v <= 0:
        return None
    major, rest = divmod(v, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor}{stepping:x}"


def _pos_int(value: Any) -> int | None:
    """A positive count below 2**31 (device limits), else None: NaN, infinities and junk."""
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 < v < 2**31 else None


def agent_device_row(agent: Mapping[str, Any], device_id: int, rank: int) -> dict[str, Any]:
    """A devices-frame row from a rocprofiler-sdk agent record (`rocprofiler_agent_v0_t` as
    rocprofv3 writes it to JSON or rocpd `extdata`). Fields the agent lacks stay missing so
    that `advisor.devices.complete_devices` can fill them."""
    name = agent.get("name")
    arch = name if isinstance(name, str) and name.startswith("gfx") else gfx_name(agent.get("gfx_target_version"))
    product = agent.get("product_name") or agent.get("marketing_name")
    waves = _pos_int(agent.get("max_waves_per_cu"))
    if waves is None:
        simd, per_simd = _pos_int(agent.get("simd_per_cu")), _pos_int(agent.get("max_waves_per_simd"))
        waves = simd * per_simd if simd and per_simd else None
    lds_kb = _pos_int(agent.get("lds_size_in_kb"))
    return {
        "rank": rank,
        "device_id": device_id,
        "name": product if isinstance(product, str) and product else (name if isinstance(name, str) else None),
        "vendor": "amd",
        "arch": arch,
        "sm_count": _pos_int(agent.get("cu_count")),
        "warp_size": _pos_int(agent.get("wave_front_size")),
        "max_warps_per_sm": waves,
        "max_threads_per_block": _pos_int(agent.get("workgroup_max_size")),
        "smem_per_sm_bytes": lds_kb * 1024 if lds_kb else None,
    }
