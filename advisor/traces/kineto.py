"""PyTorch profiler (Kineto) JSON traces: `.json` or `.json.gz` (gzip told by its magic).

The file is a Chrome trace document: `traceEvents` plus Kineto's metadata
(`deviceProperties`, `distributedInfo`, `baseTimeNanoseconds`, ...). What is read:

| event `cat` | frame | notes |
| --- | --- | --- |
| `kernel` | kernels | args `grid`, `block`, `registers per thread`, `shared memory`, `device`, `stream`, `correlation` |
| `cuda_runtime`, `cuda_driver` | runtime | HIP calls appear here too on ROCm |
| `gpu_memcpy`, `gpu_memset` | memcpy | bytes from args `bytes`, else `memory bandwidth (GB/s)` x dur, else the launching call's `size` |
| `cpu_op` | cpu_ops | `Input Dims` (PyTorch 1.8: `Input dims`) / `Input type` / `Input Strides` / `Concrete Inputs` kept as JSON text |
| `user_annotation` | nvtx | domain `torch.profiler` (`record_function` ranges, `ProfilerStep#N`) |

`gpu_user_annotation` (the GPU-side copy of user annotations) is ignored; so are Python
function events and flow arrows. Old PyTorch (1.8/1.9) capitalised categories (`Kernel`,
`Runtime`, `Memcpy`, `Operator`); those are accepted too.

Times: `ts`/`dur` are microseconds as floats (the Trace Event Format's unit whatever
`displayTimeUnit` says, which only affects display). Newer Kineto writes `ts` relative to
`baseTimeNanoseconds`; we add it back so files of different ranks share one clock. Converting
to integer nanoseconds rounds and never goes through `ts * 1000` in float64 (see
`_jsonio.us_to_ns`).

Kernel details:
- `shared memory` is Kineto's static + dynamic total; it goes to `static_smem_bytes` and
  `dynamic_smem_bytes` stays unknown. Kineto's own `blocks per SM` / `warps per SM`
  estimates are not kept (advisor computes occupancy itself).
- ROCm traces often have no grid/block on the kernel event; they are taken from the
  launching HIP call (same `correlation`). `hipExtModuleLaunchKernel` and
  `hipHccModuleLaunchKernel` (hipBLASLt/Tensile GEMMs) take a *global work size*, so their
  grid is in work-items and is converted to workgroups (ceil(grid / block) per dimension).
- ROCm numbers devices in kernel events by HSA agent (CPUs included: one MI300X can show
  up as `device: 2`), which `deviceProperties` (HIP ordinals) may not list. When every listed
  device is the same model, the unlisted id is described by that model and a note says so.

Devices: one row per device that ran kernels or copies (all listed devices if none did),
from `deviceProperties` (`numSms`, `maxThreadsPerMultiprocessor / warpSize` warps per SM,
registers and shared memory per SM, `sharedMemPerBlockOptin`). `distributedInfo.rank` becomes
`meta["declared_rank"]` so several files load with their own ranks.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..model import STRING, Trace, string_array
from ._jsonio import gc_paused, key, msgspec, stream_object, to_float, to_int, us_to_ns
from ._names import short_names

FORMAT = "kineto"
DESCRIPTION = "PyTorch profiler / Kineto JSON (.json, .json.gz)"

# event category -> bucket
_CATS = {
    "kernel": "kernel",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "runtime": "runtime",
    "driver": "runtime",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "annotation",
}
# HIP launch calls whose grid argument is a global work size (work-items), not blocks.
_WORKITEM_LAUNCHES = frozenset({"hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel"})
_MEMCPY_KIND = re.compile(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP)\b")
_BOM = b"\xef\xbb\xbf"


def sniff(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    if text.startswith(_BOM):
        text = text[len(_BOM):].lstrip()
    if not text.startswith(b"{"):
        return False
    if b'"traceEvents"' in head:
        return True
    # Kineto writes its metadata first; a long `INFO` log can push traceEvents past the head.
    return b'"schemaVersion"' in head and (b'"deviceProperties"' in head or b'"distributedInfo"' in head)


# Events are turned into frames in batches of this many per category while the file streams
# by, so memory holds frames (a few numbers per event) and one batch of decoded events, never
# the whole document (a 2 GB trace decoded at once took ~10x its size).
_BATCH = 50_000


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    notes = _Notes()
    acc = _Frames(rank, notes)
    with gc_paused():
        doc = stream_object(path, "traceEvents", acc.add, "PyTorch profiler", _Event, _event)
        if doc is None or doc.get("traceEvents") is not True:
            raise TraceError(f"{path.name}: JSON without a traceEvents list (not a PyTorch profiler trace)")
        base_ns = _base_ns(doc.get("baseTimeNanoseconds"))
        frames = acc.finish(base_ns)
    kernels, memcpy = frames["kernel"], frames["memcpy"]
    devices = _devices(doc, kernels, memcpy, rank, notes)

    if not acc.seen:
        notes.append(
            "no PyTorch profiler events (kernel, cuda_runtime, cpu_op...) in traceEvents: "
            "is this a Chrome trace written by another tool?"
        )
    meta: dict[str, Any] = {"format": FORMAT, "notes": notes.final()}
    dist = doc.get("distributedInfo")
    if isinstance(dist, dict) and dist.get("rank") is not None:
        try:
            meta["declared_rank"] = _rank(dist["rank"])
        except (TypeError, ValueError, OverflowError):
            meta["notes"].append(f"distributedInfo.rank is not a rank number ({repr(dist['rank'])[:40]}); rank taken from file order")
    if isinstance(dist, dict):
        world = dist.get("world_size")
        if type(world) is int and 1 <= world <= _MAX_WORLD:
            meta["world_size"] = world
        elif world is not None:
            meta["notes"].append(f"distributedInfo.world_size is not a plausible rank count ({repr(world)[:40]}): ignored")
    if isinstance(doc.get("traceName"), str):
        meta["trace_name"] = doc["traceName"]
    return Trace.build(
        meta=meta, kernels=kernels, runtime=frames["runtime"], memcpy=memcpy, nvtx=frames["annotation"],
        cpu_ops=frames["cpu_op"], devices=devices,
    )


# ---------------------------------------------------------------------------------------------
# events: only the fields some frame reads, decoded straight into these (msgspec skips the
# rest in C: Kineto's "External id", "queued", occupancy estimates, Python stacks...).

# Where a field's presence matters, not only its value ("grid" in a launch call's args).
_ABSENT = msgspec.UNSET if msgspec is not None else object()

# attribute -> key in the event's args
_ARG_KEYS = {
    "correlation": "correlation", "grid": "grid", "block": "block", "smem": "shared memory",
    "regs": "registers per thread", "device": "device", "stream": "stream", "graph_node": "graph node id",
    "coll": "Collective name", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems", "dtype": "dtype",
    "group": "Group size", "bytes": "bytes", "bw": "memory bandwidth (GB/s)", "kind": "kind", "size": "size",
    "dims": "Input Dims", "dims_old": "Input dims", "types": "Input type", "strides": "Input Strides",
    "concrete": "Concrete Inputs",
}
_ARG_DEFAULTS = {"grid": _ABSENT, "size": _ABSENT}
# attribute -> (key, default): the defaults are what dict.get gave before (no "ph" is "X")
_EVENT_KEYS = {"ph": "X", "cat": None, "name": None, "pid": None, "tid": None, "ts": None, "dur": 0}

# kept as their JSON text (msgspec.Raw) until _json_text: decoding a shape list per cpu_op
# into Python lists, then repr() to find it in a cache, cost ~5 us an op
_RAW_ARGS = {"dims", "dims_old", "types", "strides", "concrete"}

if msgspec is not None:
    _Args = msgspec.defstruct(
        "_Args", [(a, msgspec.Raw if a in _RAW_ARGS else Any, msgspec.field(default=_ARG_DEFAULTS.get(a), name=k))
                  for a, k in _ARG_KEYS.items()],
        gc=False,  # decoded JSON has no cycles: keep millions of these out of the collector
    )
    _Event = msgspec.defstruct("_Event", [*((a, Any, d) for a, d in _EVENT_KEYS.items()), ("args", Optional[_Args], None)],
                               gc=False)
else:
    class _Plain:
        __slots__ = ()
        _defaults: dict = {}

        def __init__(self, **kw):
            for a, d in self._defaults.items():
                setattr(self, a, kw.get(a, d))

    class _Args(_Plain):
        __slots__ = tuple(_ARG_KEYS)
        _defaults = {a: _ARG_DEFAULTS.get(a) for a in _ARG_KEYS}

    class _Event(_Plain):
        __slots__ = (*_EVENT_KEYS, "args")
        _defaults = {**_EVENT_KEYS, "args": None}

_NO_ARGS = _Args()
_Raw = msgspec.Raw if msgspec is not None else type(None)
_RAW_NULL = _Raw(b"null") if msgspec is not None else None


def _event(value: Any):
    """An event decoded as plain JSON values (the standard library's path, or an element
    msgspec could not type) as an `_Event`; None for an element that is not an object."""
    if type(value) is not dict:
        return None
    a = value.get("args")
    args = _Args(**{attr: a[k] for attr, k in _ARG_KEYS.items() if k in a}) if type(a) is dict else None
    return _Event(**{attr: value.get(attr, d) for attr, d in _EVENT_KEYS.items()}, args=args)


def _present(v: Any) -> Any:
    return None if v is _ABSENT else v


class _Notes(list):
    """Notes of a streamed read: counts said once per read, not once per batch."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def count(self, template: str, n: int) -> None:
        """Add `n` to the count of note `template` (with "{n}" where the total goes)."""
        if n:
            self.counts[template] = self.counts.get(template, 0) + n

    def final(self) -> list[str]:
        return [t.format(n=n) for t, n in self.counts.items()] + list(self)


def _bucket(cat: Any) -> str | None:
    if type(cat) is not str:
        return None
    return _CATS.get(cat) or _CATS.get(cat.lower())


class _Frames:
    """Buckets events by category and turns each full bucket into frame rows."""

    def __init__(self, rank: int, notes: _Notes):
        self.rank, self.notes = rank, notes
        self.pending: dict[str, list[dict]] = {b: [] for b in set(_CATS.values())}
        self.parts: dict[str, list[pd.DataFrame]] = {b: [] for b in self.pending}
        self.launches: dict[Any, tuple[str | None, dict]] = {}
        self.seen = False

    def add(self, events: list) -> None:
        """Events of one decoded chunk into their buckets, in file order. The category of each
        event is looked up once per distinct value, not once per event."""
        cats = [e.cat for e in events]
        try:
            bucket_of = {c: _bucket(c) for c in set(cats)}
        except TypeError:  # a list or object as a category (no dict key): event by event
            return self._add_each(events)
        if len(bucket_of) == 1 and None in bucket_of.values():
            return
        of = [bucket_of[c] for c in cats]
        for b in set(bucket_of.values()) - {None}:
            sel = [e for e, x in zip(events, of) if x == b and e.ph == "X"]
            if sel:
                self.seen = True
                bucket = self.pending[b]
                bucket.extend(sel)
                if len(bucket) >= _BATCH:
                    self.flush(b)

    def _add_each(self, events: list) -> None:
        pending, cats = self.pending, _CATS
        for e in events:
            cat = e.cat
            if type(cat) is not str:  # a list or object there is no category (and no dict key)
                continue
            b = cats.get(cat)
            if b is None:
                b = cats.get(cat.lower())
                if b is None:
                    continue
            if e.ph != "X":
                continue
            self.seen = True
            bucket = pending[b]
            bucket.append(e)
            if len(bucket) >= _BATCH:
                self.flush(b)

    def flush(self, b: str) -> None:
        events, self.pending[b] = self.pending[b], []
        if not events:
            return
        rank, notes = self.rank, self.notes
        if b == "runtime":
            df, launches = _runtime(events, rank, 0, notes)
            self.launches.update(launches)
        elif b == "kernel":
            df = _kernels(events, rank, 0, self.launches, notes)
        elif b in ("memcpy", "memset"):
            df = _memcpy(events if b == "memcpy" else [], events if b == "memset" else [], rank, 0, self.launches, notes)
        elif b == "cpu_op":
            df = _cpu_ops(events, rank, 0, notes)
        else:
            df = _annotations(events, rank, 0, notes)
        self.parts[b].append(df)

    def finish(self, base_ns: int) -> dict[str, pd.DataFrame]:
        # runtime first: its launches complete the kernels and copies still pending
        for b in sorted(self.pending, key=lambda b: b != "runtime"):
            self.flush(b)
        rank, notes = self.rank, self.notes
        empty = {
            "runtime": lambda: _runtime([], rank, 0, notes)[0],
            "kernel": lambda: _kernels([], rank, 0, {}, notes),
            "memcpy": lambda: _memcpy([], [], rank, 0, {}, notes),
            "cpu_op": lambda: _cpu_ops([], rank, 0, notes),
            "annotation": lambda: _annotations([], rank, 0, notes),
        }
        out = {}
        for b, make in empty.items():
            # parts are let go as each frame is joined: only one frame's parts and its copy
            # are alive at once, not every batch of every frame beside the joined frames
            parts = self.parts.pop(b) + (self.parts.pop("memset") if b == "memcpy" else [])
            out[b] = pd.concat(parts, ignore_index=True) if parts else make()
            del parts
        _late_launches(out["kernel"], out["memcpy"], self.launches, notes)
        for b, df in out.items():
            out[b] = _add_base(df.drop(columns=["_launch_seen"], errors="ignore"), base_ns, b, notes)
        return out


def _add_base(df: pd.DataFrame, base_ns: int, what: str, notes: _Notes) -> pd.DataFrame:
    """Times relative to baseTimeNanoseconds made absolute (Kineto writes the base after the
    events, so it is added once all are read); rows that would pass 2**62 ns are dropped."""
    if not base_ns or df.empty:
        return df
    end = df["end_ns"].to_numpy(dtype="int64") + base_ns
    keep = end < _MAX_NS
    if not keep.all():
        notes.count(f"{{n}} {what} event(s) without a valid ts/dur were skipped", int((~keep).sum()))
        df = df[keep].reset_index(drop=True)
    df["start_ns"] = df["start_ns"] + base_ns
    df["end_ns"] = df["end_ns"] + base_ns
    return df


def _late_launches(kernels: pd.DataFrame, memcpy: pd.DataFrame, launches: dict, notes: _Notes) -> None:
    """Kernels and copies whose launching call came later in the file than their batch:
    grid/block/shared memory (ROCm) and copy sizes from that call, as `_kernels` and
    `_memcpy` take them from calls read before."""
    if not launches:
        return
    if len(kernels) and "_launch_seen" in kernels:
        rows = np.flatnonzero(~kernels["_launch_seen"].to_numpy(dtype=bool) & kernels["correlation_id"].notna().to_numpy())
        rows = [i for i in rows if int(kernels["correlation_id"].iat[i]) in launches]
        if rows:
            sub = kernels.iloc[rows]
            grid_missing = sub[["grid_x", "grid_y", "grid_z"]].isna().all(axis=1).to_numpy()
            filled = 0
            cols = {c: kernels[c].astype("Int64").copy() for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "static_smem_bytes")}
            workitem = 0
            for j, i in enumerate(rows):
                api, la = launches[int(kernels["correlation_id"].iat[i])]
                if grid_missing[j] and la.get("grid") is not None:
                    for name, v in zip(("grid_x", "grid_y", "grid_z"), _triple(la.get("grid"))):
                        cols[name].iat[i] = v
                    for name, v in zip(("block_x", "block_y", "block_z"), _triple(la.get("block"))):
                        cols[name].iat[i] = v
                    filled += 1
                if pd.isna(cols["static_smem_bytes"].iat[i]):
                    cols["static_smem_bytes"].iat[i] = to_int([la.get("shared memory")]).iat[0]
                if api in _WORKITEM_LAUNCHES:
                    for g, bk in (("grid_x", "block_x"), ("grid_y", "block_y"), ("grid_z", "block_z")):
                        gv, bv = cols[g].iat[i], cols[bk].iat[i]
                        cols[g].iat[i] = -((-gv) // bv) if not pd.isna(gv) and not pd.isna(bv) and bv > 0 else pd.NA
                    workitem += 1
            for name, col in cols.items():
                kernels[name] = col
            kernels["grid_blocks"] = kernels["grid_x"] * kernels["grid_y"] * kernels["grid_z"]
            kernels["block_threads"] = kernels["block_x"] * kernels["block_y"] * kernels["block_z"]
            notes.count("grid/block of {n} kernel(s) taken from their launching HIP call", filled)
            notes.count("{n} kernel(s) launched with hipExtModuleLaunchKernel/hipHccModuleLaunchKernel: "
                        "grid converted from work-items to workgroups", workitem)
    if len(memcpy) and "_launch_seen" in memcpy:
        late = ~memcpy["_launch_seen"].to_numpy(dtype=bool) & memcpy["bytes"].isna().to_numpy() & memcpy["correlation_id"].notna().to_numpy()
        for i in np.flatnonzero(late):
            launch = launches.get(int(memcpy["correlation_id"].iat[i]))
            if launch is not None:
                size = to_int(to_float([launch[1].get("size")])).iat[0]
                memcpy.loc[memcpy.index[i], "bytes"] = size


def _triple(v: Any) -> list:
    vals = v if type(v) is list and len(v) == 3 else [None, None, None]
    return list(to_int(vals))


# ---------------------------------------------------------------------------------------------
# helpers


# Nanosecond times must fit int64: a base time, and base + |ts| + dur of every event, must
# stay below 2**62 ns (146 years), which any real clock does.
_MAX_NS = 2**62
# The largest jobs run ~10^5 GPUs; a world size beyond 2**20 is corrupt or hostile.
_MAX_WORLD = 2**20


def _base_ns(value: Any) -> int:
    """baseTimeNanoseconds as an int; 0 when missing, not a number or out of range."""
    if isinstance(value, bool) or value is None:
        return 0
    try:
        ns = int(value)
    except (TypeError, ValueError, OverflowError):
        try:
            ns = int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0
    return ns if 0 <= ns < _MAX_NS else 0


def _rank(value: Any) -> int:
    """distributedInfo.rank as a non-negative int (ValueError for anything else)."""
    if isinstance(value, bool):
        raise ValueError(value)
    rank = int(value)
    if not 0 <= rank < 2**31 or (isinstance(value, float) and value != rank):
        raise ValueError(value)
    return rank


def _args(events: list) -> list:
    no = _NO_ARGS
    return [e.args or no for e in events]


def _times(events: list[dict], base_ns: int, what: str, notes: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keep mask, start_ns, dur_ns) for `events`; events without a usable ts/dur are dropped
    with a note."""
    ts = to_float([e.ts for e in events])
    dur = to_float([e.dur for e in events])
    with np.errstate(invalid="ignore", over="ignore"):
        # start and end in ns must fit int64 (a hostile 1e300 would wrap around silently)
        span_ns = np.abs(ts) * 1000.0 + dur * 1000.0 + float(base_ns)
        keep = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (span_ns < float(_MAX_NS))
    notes.count(f"{{n}} {what} event(s) without a valid ts/dur were skipped", int((~keep).sum()))
    start = us_to_ns(np.where(keep, ts, 0.0)) + base_ns
    d = us_to_ns(np.where(keep, dur, 0.0))
    return keep, start[keep], d[keep]


def _pick(values: list, keep: np.ndarray) -> list:
    if keep.all():
        return values
    return [v for v, k in zip(values, keep) if k]


def _dim3(values: list) -> tuple[list, list, list]:
    none = (None, None, None)
    triples = [v if type(v) is list and len(v) == 3 else none for v in values]
    # three comprehensions: zip(*triples) over 50k lists took ~4x as long
    return [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples]


def _names(events: list[dict]) -> list:
    """Each event's name; equal names share one string object (interned), so a million
    launches of a few kernels hold a few strings, and factorizing them is cheap."""
    intern = sys.intern
    return [intern(n) if type(n) is str else None for n in (e.name for e in events)]


def _device(events: list[dict], args: list[dict]) -> list:
    """args.device, else the GPU lane's pid (Kineto puts device N's activity in pid N)."""
    out = []
    for e, a in zip(events, args):
        d = a.device
        if d is None:
            pid = e.pid
            d = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        out.append(d)
    return out


# ---------------------------------------------------------------------------------------------
# frames


def _runtime(events, rank, base_ns, notes):
    """Runtime frame, plus {correlation: (api name, args)} of launch calls for the ROCm fix-ups."""
    keep, start, dur = _times(events, base_ns, "runtime", notes)
    events = _pick(events, keep)
    args = _args(events)
    names = _names(events)
    corr = [key(a.correlation) for a in args]  # a list there would be no dict key
    df = pd.DataFrame(
        {
            "rank": rank,
            "thread_id": to_int([e.tid for e in events]),
            "correlation_id": to_int(corr),
            "start_ns": start,
            "end_ns": start + dur,
            "dur_ns": dur,
            "name": _text(names),
        }
    )
    launches: dict[Any, tuple[str | None, dict]] = {}
    for c, n, a in zip(corr, names, args):
        if c is not None and (a.grid is not _ABSENT or a.size is not _ABSENT or n in _WORKITEM_LAUNCHES):
            # what the kernel and copy rows take from their launching call, as a dict
            launches[c] = (n, {"grid": _present(a.grid), "block": a.block, "shared memory": a.smem,
                               "size": _present(a.size)})
    return df, launches


def _text(values: list) -> pd.arrays.StringArray:
    """A text column built as the schema's Python-backed strings directly: a list of str
    given to a DataFrame became an Arrow string column under pandas 3, converted back to
    Python strings by `conform` (~1 s per million names)."""
    if values.count(None) == len(values):  # a field no event has (collective name, dtype): ~7x faster
        return string_array(np.full(len(values), pd.NA, dtype=object))
    return pd.array(np.array(values, dtype=object), dtype=STRING)


def _text_or_none(v):
    return v if isinstance(v, str) and v else None


def _kernels(events, rank, base_ns, launches, notes):
    keep, start, dur = _times(events, base_ns, "kernel", notes)
    events = _pick(events, keep)
    args = _args(events)
    corr = [key(a.correlation) for a in args]
    grid = [_present(a.grid) for a in args]
    block = [a.block for a in args]
    smem = [a.smem for a in args]
    workitem_api: list[bool] = []
    filled = 0
    for i, c in enumerate(corr):
        launch = launches.get(c) if c is not None else None
        if launch is None:
            workitem_api.append(False)
            continue
        api, la = launch
        if grid[i] is None and la.get("grid") is not None:
            grid[i], block[i] = la.get("grid"), la.get("block")
            filled += 1
        if smem[i] is None:
            smem[i] = la.get("shared memory")
        workitem_api.append(api in _WORKITEM_LAUNCHES)
    notes.count("grid/block of {n} kernel(s) taken from their launching HIP call", filled)

    gx, gy, gz = (to_int(v) for v in _dim3(grid))
    bx, by, bz = (to_int(v) for v in _dim3(block))
    wi = pd.Series(workitem_api, dtype="bool")
    if wi.any():
        for g, b in ((gx, bx), (gy, by), (gz, bz)):
            conv = -((-g) // b.where(b > 0))
            g[wi] = conv[wi]
        notes.count("{n} kernel(s) launched with hipExtModuleLaunchKernel/hipHccModuleLaunchKernel: "
                    "grid converted from work-items to workgroups", int(wi.sum()))
    names = _names(events)
    return pd.DataFrame(
        {
            "rank": rank,
            "device_id": to_int(_device(events, args)),
            "stream_id": to_int([a.stream for a in args]),
            "correlation_id": to_int(corr),
            "start_ns": start,
            "end_ns": start + dur,
            "dur_ns": dur,
            "name": _text(names),
            "short_name": _text(short_names(names)),
            "grid_x": gx,
            "grid_y": gy,
            "grid_z": gz,
            "block_x": bx,
            "block_y": by,
            "block_z": bz,
            "grid_blocks": gx * gy * gz,
            "block_threads": bx * by * bz,
            "registers_per_thread": to_int([a.regs for a in args]),
            "static_smem_bytes": to_int(smem),
            "graph_node_id": to_int([a.graph_node for a in args]),
            # NCCL kernels carry their collective's description (PyTorch >= 2.1 traces)
            "comm_name": _text([_text_or_none(a.coll) for a in args]),
            "comm_in_nelems": to_int([a.in_nelems for a in args]),
            "comm_out_nelems": to_int([a.out_nelems for a in args]),
            "comm_dtype": _text([_text_or_none(a.dtype) for a in args]),
            "comm_group_size": to_int([a.group for a in args]),
            # whether the launching call was known when this row was made (_late_launches)
            "_launch_seen": np.array([c is not None and c in launches for c in corr], dtype=bool),
        }
    )


def _memcpy(copies, sets, rank, base_ns, launches, notes):
    parts = []
    for events, op in ((copies, "memcpy"), (sets, "memset")):
        keep, start, dur = _times(events, base_ns, op, notes)
        events = _pick(events, keep)
        args = _args(events)
        names = _names(events)
        if op == "memset":
            kinds = ["memset"] * len(events)
        else:
            kinds = []
            for n, a in zip(names, args):
                m = _MEMCPY_KIND.search(n or "") or _MEMCPY_KIND.search(str(a.kind or ""))
                kinds.append(m.group(1) if m else "unknown")
        nbytes = to_float([a.bytes for a in args])
        bw = to_float([a.bw for a in args])
        # GB/s x us = 1e9 B/s x 1e-6 s = 1e3 B
        from_bw = np.rint(bw * dur.astype("float64") / 1000.0 * 1e3)
        nbytes = np.where(np.isnan(nbytes), from_bw, nbytes)
        if np.isnan(nbytes).any():
            size = []
            for a in args:
                launch = launches.get(key(a.correlation))
                size.append(launch[1].get("size") if launch else None)
            nbytes = np.where(np.isnan(nbytes), to_float(size), nbytes)
        parts.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "device_id": to_int(_device(events, args)),
                    "stream_id": to_int([a.stream for a in args]),
                    "correlation_id": to_int([a.correlation for a in args]),
                    "start_ns": start,
                    "end_ns": start + dur,
                    "dur_ns": dur,
                    "op": _text([op] * len(events)),
                    "kind": _text(kinds),
                    "bytes": to_int(nbytes),
                    "_launch_seen": np.array([key(a.correlation) in launches for a in args], dtype=bool),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


_ENCODE = json.JSONEncoder().encode


def _json_text(values: list) -> list:
    """JSON text of each value (None stays None). A trace repeats the same few shapes: each
    distinct value (keyed by its repr, computed in C) is encoded once; encoding 133k
    Input Dims lists one by one took a second."""
    cache: dict[Any, str | None] = {}
    out = []
    raw, miss = _Raw, cache  # `cache` itself is never a value: it marks a miss
    for v in values:
        if v is None:
            out.append(None)
            continue
        if type(v) is raw:  # JSON text as in the file: decoded (as the text path would) once per distinct text
            k = bytes(v)
            text = cache.get(k, miss)
            if text is miss:
                value = json.loads(k.decode("utf-8", "replace"))
                text = cache[k] = None if value is None else _ENCODE(value)
            out.append(text)
            continue
        r = repr(v)
        text = cache.get(r)
        if text is None:
            text = cache[r] = _ENCODE(v)
        out.append(text)
    return out


def _cpu_ops(events, rank, base_ns, notes):
    keep, start, dur = _times(events, base_ns, "cpu_op", notes)
    events = _pick(events, keep)
    args = _args(events)
    return pd.DataFrame(
        {
            "rank": rank,
            "thread_id": to_int([e.tid for e in events]),
            "start_ns": start,
            "end_ns": start + dur,
            "dur_ns": dur,
            "name": _text(_names(events)),
            # PyTorch 1.8 spelled it "Input dims"
            "input_dims": _text(_json_text([a.dims if a.dims is not None and a.dims != _RAW_NULL else a.dims_old for a in args])),
            "input_types": _text(_json_text([a.types for a in args])),
            # PyTorch >= 2.1: strides (a broadcast view's stride 0 says what is really read)
            # and the non-tensor arguments' values (upsampling's output size)
            "input_strides": _text(_json_text([a.strides for a in args])),
            "concrete_inputs": _text(_json_text([a.concrete for a in args])),
        }
    )


def _annotations(events, rank, base_ns, notes):
    keep, start, dur = _times(events, base_ns, "user_annotation", notes)
    events = _pick(events, keep)
    return pd.DataFrame(
        {
            "rank": rank,
            "thread_id": to_int([e.tid for e in events]),
            "start_ns": start,
            "end_ns": start + dur,
            "dur_ns": dur,
            "text": _text(_names(events)),
            "domain": _text(["torch.profiler"] * len(events)),
        }
    )


# ---------------------------------------------------------------------------------------------
# devices


def _num(p: dict, *keys: str) -> int | None:
    for k in keys:
        v = p.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def _is_amd(doc: dict, p: dict) -> bool:
    name = str(p.get("name") or "")
    if "AMD" in name or "Radeon" in name or "Instinct" in name:
        return True
    if any(k in doc for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version")):
        return True
    return p.get("warpSize") == 64


def _device_row(doc: dict, p: dict, device_id: int, rank: int) -> dict[str, Any]:
    amd = _is_amd(doc, p)
    warp = _num(p, "warpSize")
    threads_sm = _num(p, "maxThreadsPerMultiprocessor")
    major, minor = p.get("computeMajor"), p.get("computeMinor")
    row: dict[str, Any] = {
        "rank": rank,
        "device_id": device_id,
        "name": p.get("name") if isinstance(p.get("name"), str) else None,
        "vendor": "amd" if amd else "nvidia",
        "sm_count": _num(p, "numSms"),
        "warp_size": warp,
        "max_warps_per_sm": threads_sm // warp if threads_sm and warp else None,
        "max_threads_per_block": _num(p, "maxThreadsPerBlock"),
        "regs_per_sm": _num(p, "regsPerMultiprocessor"),
        "max_regs_per_block": _num(p, "regsPerBlock"),
        "smem_per_sm_bytes": _num(p, "sharedMemPerMultiprocessor", "maxSharedMemoryPerMultiProcessor"),
        "smem_per_block_optin_bytes": _num(p, "sharedMemPerBlockOptin"),
    }
    if amd:
        # HIP's major/minor (9.4 for gfx942, 9.0 for both gfx908 and gfx90a) are not a gfx
        # target; the arch comes from the name via the known-GPU table when it can.
        if row["smem_per_block_optin_bytes"] is None:
            row["smem_per_block_optin_bytes"] = _num(p, "sharedMemPerBlock")
    elif isinstance(major, int) and isinstance(minor, int):
        row.update(cc_major=major, cc_minor=minor, arch=f"{major}.{minor}")
    return row


def _devices(doc, kernels, memcpy, rank, notes):
    props: dict[int, dict] = {}
    listed = doc.get("deviceProperties")
    if listed is not None and not isinstance(listed, list):
        notes.append("deviceProperties is not a list: ignored")
        listed = []
    for p in listed or []:
        if isinstance(p, dict) and isinstance(p.get("id"), int):
            props[p["id"]] = p
    used = sorted(
        {int(d) for d in pd.concat([kernels["device_id"], memcpy["device_id"]]).dropna().unique()}
    )
    ids = used or sorted(props)
    # Every listed device the same model? Then an unlisted id (ROCm agent numbering) is that model.
    models = {tuple(key(p.get(k)) for k in ("name", "numSms", "computeMajor", "computeMinor")) for p in props.values()}
    stand_in = next(iter(props.values())) if len(models) == 1 else None
    rows = []
    for d in ids:
        p = props.get(d)
        if p is None and stand_in is not None:
            p = stand_in
            notes.append(
                f"device {d} of the GPU events is not in deviceProperties (ROCm numbers HSA agents, "
                f"CPUs included); taken to be the listed {stand_in.get('name') or 'GPU'}"
            )
        if p is not None:
            rows.append(_device_row(doc, p, d, rank))
    if used and not props:
        notes.append("the trace has no deviceProperties: device limits come from the known-GPU table or --sm-count")
    return pd.DataFrame(rows) if rows else None
