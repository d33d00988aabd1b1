"""rocprof v1 `results.json`: the Chrome trace rocprof (ROCm <= 6.x) writes beside results.csv
with `--hip-trace`, `--hsa-trace` or `--sys-trace`.

Layout (ROCm/rocprofiler `bin/tblextr.py`, `bin/sqlitedb.py`, `bin/dform.py`): the file starts
with the literal `{ "traceEvents":[{}` (an empty first event), then `process_name` metadata
events ("CPU HIP API", "COPY", "GPU0"...), "X" events and flow arrows, and ends with
`"otherData"` (rocminfo fields). Events have no `cat`, and every value, `ts` and `dur`
included, is a string. Each X event's `args` is its table row (columns whose name starts with
`__`, and `Index`, left out):
- dispatches (table KERN, from the same records as results.csv): `args` are results.csv's
  columns: `KernelName`, `gpu-id`, `queue-id`, `grd`, `wgr`, `lds`, `arch_vgpr`..., `BeginNs`,
  `EndNs` (ns). They are read exactly as results.csv is (`rocprof_csv.kernel_frames`): grid =
  ceil(grd / wgr) workgroups, reported 1-D;
- GPU activity of the HIP trace (table OPS, `hcc_ops_trace.txt`): `BeginNs`, `EndNs`, `dev-id`,
  `queue-id`, `Name`, `stream-id`... Operations named Copy/Memcpy/Fill are copies and sets
  (memcpy frame, bytes unknown). The kernels among them repeat the dispatches and carry no
  launch configuration, so they are used only when the file has no dispatch events;
- host API calls (tables HIP and HSA): `BeginNs`, `EndNs`, `pid`, `tid`, `Name`, `args`: the
  runtime frame. The correlation ids are not written (`Index` is left out), so calls are not
  matched to kernels.
`ts`/`dur` are microseconds, truncated and rebased: the `BeginNs`/`EndNs` in `args` are used
instead. rocTX ranges and HSA async copies (which name no device) are not read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceError
from ..model import Trace
from . import rocprof_csv
from ._jsonio import load_json, to_int

FORMAT = "rocprof-v1-json"
DESCRIPTION = "rocprof v1 results.json (--hip-trace, --sys-trace)"

_HEAD = re.compile(rb'^\s*\{\s*"traceEvents"\s*:\s*\[\s*\{\s*\}')  # sqlitedb.open_json
_COPY = re.compile(r"Memcpy|Copy|Fill")  # tblextr.fill_ops_db's copy pattern
_COPY_KINDS = (("HostToDevice", "HtoD"), ("DeviceToHost", "DtoH"), ("DeviceToDevice", "DtoD"), ("HostToHost", "HtoH"))


def sniff(path: Path, head: bytes) -> bool:
    if _HEAD.match(head):
        return True
    # the same document re-serialised without the empty first event
    return head.lstrip()[:1] == b"{" and b'"traceEvents"' in head and b'"KernelName"' in head and b'"BeginNs"' in head


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    doc = load_json(path, "rocprof results.json")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path.name}: JSON without a traceEvents list (not a rocprof results.json)")
    dispatches: list[dict] = []
    activity: list[dict] = []
    copies: list[dict] = []
    api: list[dict] = []
    for e in events:
        args = e.get("args") if isinstance(e, dict) and e.get("ph") == "X" else None
        if not isinstance(args, dict):
            continue
        if "KernelName" in args:
            dispatches.append(args)
        elif "args" in args:
            api.append(args)
        elif "dev-id" in args:
            name = _text(args.get("Name")) or _text(e.get("name"))
            (copies if _COPY.search(name) else activity).append({**args, "Name": name})
    notes: list[str] = []
    kernels = devices = None
    if dispatches:
        kernels, devices = rocprof_csv.kernel_frames(_text_frame(dispatches), path=path, variant="rocprof v1", rank=rank, notes=notes)
    else:
        ops = [a for a in activity if "barrier packet" not in a["Name"]]
        if ops:
            rows = [{"KernelName": a["Name"], "gpu-id": a.get("dev-id"), "queue-id": a.get("queue-id"),
                     "BeginNs": a.get("BeginNs"), "EndNs": a.get("EndNs")} for a in ops]
            kernels, devices = rocprof_csv.kernel_frames(_text_frame(rows), path=path, variant="rocprof v1", rank=rank, notes=notes)
            notes.append("kernels from the HIP activity trace only (no dispatch records): grid, workgroup and registers unknown")
        else:
            notes.append(f"no kernel dispatches in {path.name} (rocprof v1 records them with --hip-trace, --sys-trace or --timestamp on)")
    meta: dict[str, Any] = {"format": FORMAT, "variant": "rocprof v1", "notes": notes}
    return Trace.build(meta=meta, kernels=kernels, devices=devices, runtime=_api(api, rank), memcpy=_copies(copies, rank))


# ---------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _text_frame(rows: list[dict]) -> pd.DataFrame:
    """The rows as a frame of text cells, as a CSV reads ('' where a row lacks a column; a
    number or a nested value from a hand-made file becomes its text)."""
    df = pd.DataFrame(rows)
    return df.astype(object).where(df.notna(), "").astype(str)


def _times(rows: list[dict]) -> tuple[pd.Series, pd.Series, pd.Series]:
    """start, end (exact Int64 from the BeginNs/EndNs text) and the rows where both are valid."""
    start = rocprof_csv._int_exact(pd.Series([str(r.get("BeginNs", "")) for r in rows], dtype=object))
    end = rocprof_csv._int_exact(pd.Series([str(r.get("EndNs", "")) for r in rows], dtype=object))
    ok = (start.notna() & end.notna() & (end >= start)).to_numpy(dtype=bool)
    return start, end, ok


def _api(rows: list[dict], rank: int) -> pd.DataFrame:
    start, end, ok = _times(rows)
    df = pd.DataFrame(
        {
            "rank": rank,
            "thread_id": to_int([r.get("tid") for r in rows]),
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "name": [_text(r.get("Name")) or None for r in rows],
        }
    )
    return df[ok].reset_index(drop=True)


def _copies(rows: list[dict], rank: int) -> pd.DataFrame:
    start, end, ok = _times(rows)
    kinds = []
    for r in rows:
        kind = "memset" if "Fill" in r["Name"] else next((k for pat, k in _COPY_KINDS if pat in r["Name"]), "unknown")
        kinds.append(kind)
    df = pd.DataFrame(
        {
            "rank": rank,
            "device_id": to_int([r.get("dev-id") for r in rows]),
            "stream_id": to_int([r.get("stream-id", r.get("queue-id")) for r in rows]),
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "op": ["memset" if k == "memset" else "memcpy" for k in kinds],
            "kind": kinds,
        }
    )
    return df[ok].reset_index(drop=True)
