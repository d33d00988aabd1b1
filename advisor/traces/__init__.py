"""Readers: one module per trace format, all returning the same `Trace`.

Each reader module defines
    FORMAT: str                               # stable id, e.g. "nsys-sqlite"
    DESCRIPTION: str                          # one line for `--help` and errors
    sniff(path: Path, head: bytes) -> bool    # True if the content is this format
    read(path: Path, *, rank: int, cache_dir: Path | None) -> Trace

`head` is the first bytes of the file, already gunzipped when the file is gzip. Detection is
by content; the extension is only a tie-breaker inside a reader. `load_trace` checks the
path, picks the reader, merges several files (one per rank) and completes device limits.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ..devices import complete_devices
from ..errors import NoKernelsError, TraceError
from ..model import FRAMES, Trace, conform, narrow
from . import graphs
from .runs import file_digest, unrelated_reasons
from . import (
    _inflate,
    kineto,
    nsys_rep,
    nsys_sqlite,
    rocpd,
    rpd,
    rocprof_csv,
    rocprof_json,
    rocprof_v1_db,
    rocprof_v1_json,
)

# Order matters only where two sniffers could both accept: rocprof v1's results.json is a
# Chrome trace too, which Kineto's sniffer (any traceEvents document) would take.
READERS = (nsys_rep, nsys_sqlite, rocpd, rpd, rocprof_v1_db, rocprof_v1_json, kineto, rocprof_json, rocprof_csv)
FORMATS = {r.FORMAT: r for r in READERS}

HEAD_BYTES = 64 << 10


def read_head(path: Path) -> bytes:
    """First bytes of the file's content (gunzipped if it is gzip)."""
    with open(path, "rb") as fh:
        raw = fh.read(HEAD_BYTES)
    if raw[:2] == b"\x1f\x8b":
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = d.decompress(raw, HEAD_BYTES)
        except zlib.error as exc:
            raise TraceError(f"{path.name}: corrupt gzip data ({exc})") from None
        if not out and not d.eof:  # nothing came out and the stream did not end: cut short
            raise TraceError(f"{path.name}: truncated gzip data (nothing could be decompressed)")
        return out
    return raw


def detect(path: Path) -> str:
    """The FORMAT id of the reader that accepts `path`, or a TraceError saying what it is not."""
    head = read_head(path)
    if not head.strip():
        raise TraceError(f"{path.name}: file is empty")
    first_error: TraceError | None = None
    for reader in READERS:
        try:
            if reader.sniff(path, head):
                return reader.FORMAT
        except TraceError as exc:  # e.g. a corrupt SQLite file: say so if nothing else fits
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    known = ", ".join(r.DESCRIPTION for r in READERS)
    raise TraceError(f"{path.name}: unknown trace format (advisor reads: {known})")


SQLITE_MAGIC = b"SQLite format 3\x00"


def _declared_sqlite_size(header: bytes) -> int | None:
    """Bytes a SQLite file says it has (page size x page count) when its header's count is
    valid (the "version-valid-for" field matches the change counter), else None."""
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC) or header[24:28] != header[92:96]:
        return None
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    return page_size * pages or None


def _complete_sqlite(path: Path) -> bool:
    """A cached gunzipped copy is reused only if it is a SQLite file of the size its header
    declares (when it declares one): a truncated or foreign file is made again."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
        declared = _declared_sqlite_size(header)
        return header.startswith(SQLITE_MAGIC) and declared in (None, os.path.getsize(path))
    except OSError:
        return False


def gunzip_sqlite(path: Path, cache_dir: Path | None) -> Path:
    return _gunzip_sqlite(path, cache_dir)[0]


def _gunzip_sqlite(path: Path, cache_dir: Path | None) -> tuple[Path, bool]:
    """A gzip-compressed SQLite trace (`trace.sqlite.gz`) decompressed into the cache
    (keyed on the source's content identity, reused when still sound), since SQLite cannot
    read through gzip. Inflated in chunks, never past the cap nor past the size the
    database's own header declares; a failed or interrupted copy is removed. Returns
    (copy, whether it came from the cache)."""
    from ..safeio import create_temp
    from . import _cache

    cache = _cache.cache_root(cache_dir)
    stem = path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name
    target = cache / f"{Path(stem).stem}-{_cache.source_key(path)}.sqlite"
    if _cache.lookup(target, _complete_sqlite):
        return target, True
    cap = _inflate.max_inflated_bytes()
    tmp = None
    try:
        fd, tmp = create_temp(cache, target.name, private=True)
        with _inflate.open_content(path, cap=cap) as src, os.fdopen(fd, "wb") as dst:
            written, limit = 0, cap
            while chunk := src.read(1 << 20):
                if written == 0:
                    declared = _declared_sqlite_size(chunk[:100])
                    limit = min(cap, declared) if declared else cap
                written += len(chunk)
                if written > limit:
                    raise TraceError(
                        f"{path.name}: inflates past the {limit:,} bytes its SQLite header declares "
                        "(corrupt, or a gzip bomb)" if limit < cap else str(_inflate._too_big(path.name, cap))
                    )
                dst.write(chunk)
        os.replace(tmp, target)
    except TraceError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        why = str(exc).removeprefix(f"{path.name}: ")
        raise TraceError(f"{path.name}: cannot decompress gzip SQLite trace: {why}") from None
    except (OSError, EOFError, MemoryError) as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)  # no half-written copy left in the cache
        why = getattr(exc, "strerror", None) or exc or type(exc).__name__
        raise TraceError(f"{path.name}: cannot decompress gzip SQLite trace ({why})") from None
    except BaseException:  # Ctrl-C mid-copy: still no partial file
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    return target, False


def _check_path(path: Path) -> None:
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected a trace file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise TraceError(f"{path}: not a regular file, expected a trace file")
    if not os.access(path, os.R_OK):
        raise TraceError(f"{path}: permission denied")


def _declared_ranks(traces: Sequence[Trace]) -> list[int] | None:
    ranks = [t.meta.get("declared_rank") for t in traces]
    if len(traces) > 1 and all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
        return [int(r) for r in ranks]
    return None


def merge(traces: Sequence[Trace]) -> Trace:
    """One Trace from several (one per rank). Ranks come from the files when every file
    declares a distinct one (Kineto distributedInfo), else from the order given; a file that
    holds several ranks itself (nsys_sqlite: one capture of several processes) contributes
    them all, in order."""
    if len(traces) == 1:
        t = traces[0]
        declared = t.meta.get("declared_rank")
        if declared is not None:
            for name in FRAMES:
                getattr(t, name)["rank"] = int(declared)
            if t.meta.get("serialized_ranks"):
                t.meta["serialized_ranks"] = [int(declared)]
        return t
    # A file may hold several ranks already (an nsys capture of several processes): its
    # ranks then keep their order and follow the previous file's, one rank per (file, rank)
    rank_maps, nxt = [], 0
    owns = [t.ranks or [0] for t in traces]  # each a pass over every frame: once per file
    declared = None if any(len(own) > 1 for own in owns) else _declared_ranks(traces)
    for i, own in enumerate(owns):
        if declared is not None:
            rank_maps.append({r: declared[i] for r in own})
        else:
            rank_maps.append({r: nxt + j for j, r in enumerate(own)})
            nxt += len(own)
    ranks = sorted({r for m in rank_maps for r in m.values()})
    frames = {}
    for name in FRAMES:
        parts = []
        for rank_of, t in zip(rank_maps, traces):
            df = getattr(t, name).copy()
            df["rank"] = df["rank"].map(rank_of).astype("int64")
            parts.append(df)
        frames[name] = pd.concat(parts, ignore_index=True) if parts else None
    meta = {
        "format": [t.meta.get("format") for t in traces],
        "sources": [s for t in traces for s in t.meta.get("sources", [])],
        "notes": [n for t in traces for n in t.meta.get("notes", [])],
        "ranks": ranks,
    }
    # ranks whose kernels the profiler serialized (counter collection: rocprof_csv) keep the mark
    serialized = {m[r] for m, t in zip(rank_maps, traces) for r in t.meta.get("serialized_ranks", ()) if r in m}
    if serialized:
        meta["serialized_ranks"] = sorted(serialized)
    sizes = [t.meta["world_size"] for t in traces if isinstance(t.meta.get("world_size"), int)]
    if sizes:
        meta["world_size"] = max(sizes)
    return Trace.build(meta=meta, **frames)


# Launch values no GPU can have (what a corrupt or hand-edited file may hold): CUDA caps each
# grid dimension at 2**31-1 blocks and a block at 1024 threads (AMD: 1024 work-items), so
# dimensions outside 1..2**31-1, negative register or shared-memory counts, and products that
# overflow int64 are made unknown (<NA>) instead of reaching occupancy and wave arithmetic.
_DIM_COLS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
_MAX_DIM = 2**31 - 1


def _mask_impossible(trace: Trace) -> None:
    k = trace.kernels
    if k.empty:
        return
    bad_rows = np.zeros(len(k), dtype=bool)
    changed = {"grid": False, "block": False}
    for col in (*_DIM_COLS, "registers_per_thread", "static_smem_bytes", "dynamic_smem_bytes"):
        low = 1 if col in _DIM_COLS else 0
        bad = ((k[col] < low) | (k[col] > _MAX_DIM)).fillna(False).to_numpy(dtype=bool)
        if bad.any():
            k[col] = k[col].mask(bad)
            bad_rows |= bad
            if col in _DIM_COLS:
                changed[col.split("_")[0]] = True
    for prefix, total in (("grid", "grid_blocks"), ("block", "block_threads")):
        dims = [k[f"{prefix}_{a}"] for a in "xyz"]
        # every value is now 1..2**31-1 or NA: when the columns' maxima multiply to under
        # 2**62 no product can reach 2**63 (even as a rounded float), and the Float64
        # products below (~40 bytes a kernel, the read's peak) are not needed
        highs = [d.max() for d in dims]
        if not changed[prefix] and all(h is pd.NA or 0 <= h for h in highs):
            bound = 1
            for h in highs:
                bound *= 1 if h is pd.NA else int(h)
            if bound < 2**62:
                continue
        product = dims[0].astype("Float64") * dims[1].astype("Float64") * dims[2].astype("Float64")
        over = (product >= 2.0**63).fillna(False).to_numpy(dtype=bool)
        if over.any() or changed[prefix]:
            d = [x.mask(over).astype("Int64") for x in dims]  # a reader may give Int32 (narrow_fitting)
            k[total] = d[0] * d[1] * d[2]
            bad_rows |= over
    n = int(bad_rows.sum())
    if n:
        trace.note(
            f"{n} kernel launch(es) had impossible grid/block/register/shared-memory values "
            "(zero, negative or beyond CUDA's limits); those values are treated as unknown"
        )


def load_trace(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    sm_count: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    require_kernels: bool = True,
    max_inflated_bytes: int | str | None = None,
    allow_unrelated: bool = False,
) -> Trace:
    """Read one trace file, or several (one per rank), into one `Trace`.

    Raises `TraceError` (one line, user-fixable) for a missing, unreadable, unknown, corrupt or
    kernel-less file. `sm_count` overrides the SM count of every device (for traces that do
    not record it). `cache_dir` is where `.nsys-rep` files are exported to SQLite.
    `max_inflated_bytes` caps what one gzip file may inflate to (bytes or "8G"; default
    $ADVISOR_MAX_INFLATED_BYTES, else 4 GiB: see `_inflate`).

    Several files must be the ranks of one run (`runs.unrelated_reasons`: not the same
    content twice, no rank declared twice, one GPU model, clocks that meet); otherwise a
    TraceError says why, or, with `allow_unrelated`, a note does and the trace is marked
    (`meta["unrelated_ranks"]`) so that no cross-rank figure is computed.
    """
    with _inflate.limit(max_inflated_bytes):
        return _load(paths, sm_count=sm_count, cache_dir=cache_dir, require_kernels=require_kernels,
                     allow_unrelated=allow_unrelated)


def _load(paths, *, sm_count, cache_dir, require_kernels, allow_unrelated=False) -> Trace:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    cache = Path(cache_dir) if cache_dir is not None else None
    traces = []
    given: dict[Path, Path] = {}
    for rank, path in enumerate(paths):
        _check_path(path)
        first = given.setdefault(path.resolve(), path)
        if first is not path:  # each file is read as one rank: twice would be two identical ranks
            raise TraceError(f"{path}: given twice (also as {first}); pass each rank's trace once")
        source = path
        try:
            cached = False
            if _inflate.is_gzip(path) and read_head(path).startswith(SQLITE_MAGIC):
                path, cached = _gunzip_sqlite(path, cache)
            try:
                fmt = detect(path)
                t = FORMATS[fmt].read(path, rank=rank, cache_dir=cache)
            except TraceError:
                if not cached:
                    raise
                # a cached copy that does not read (damaged since): made again, once
                path.unlink(missing_ok=True)
                path, _ = _gunzip_sqlite(source, cache)
                fmt = detect(path)
                t = FORMATS[fmt].read(path, rank=rank, cache_dir=cache)
        except TraceError as exc:
            if path == source:
                raise
            path.unlink(missing_ok=True)  # a decompressed copy that cannot be read is not kept
            # errors about the decompressed copy in the cache name the file the user gave
            raise TraceError(str(exc).replace(path.name, source.name)) from None
        except MemoryError:
            raise TraceError(f"{source.name}: too large to read into this machine's memory") from None
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{source.name}: cannot read trace ({exc})") from None
        t.meta.setdefault("format", fmt)
        t.meta["sources"] = [source.name]  # the file the user named, not a cache copy
        traces.append(t)
    reasons = unrelated_reasons(traces, paths, [file_digest(p) for p in paths]) if len(paths) > 1 else []
    if reasons and not allow_unrelated:
        raise TraceError(
            f"these files are not the ranks of one run: {'; '.join(reasons)}. Pass one run's per-rank traces, "
            "or --allow-unrelated to read them side by side without cross-rank figures"
        )
    trace = merge(traces)
    if reasons:
        trace.meta["unrelated_ranks"] = reasons
        trace.note(
            f"files read side by side, not as one run ({'; '.join(reasons)}): each rank is judged on its own, "
            "with no clock alignment, waits, slowest rank or critical path across them"
        )
    _mask_impossible(trace)
    narrow(trace)  # after the masking: what is left fits in int32
    graphs.attribute(trace)
    complete_devices(trace, sm_count=sm_count)
    world = trace.meta.get("world_size")
    if isinstance(world, int) and world > len(trace.ranks):
        trace.note(
            f"the trace is part of a {world}-rank run but holds {len(trace.ranks)} rank(s): pass every rank's trace "
            "(advisor diagnose rank0.json rank1.json ...) so that time spent inside collectives waiting for other "
            "ranks can be told apart from communication that compute could hide"
        )
    if require_kernels and trace.kernels.empty:
        names = ", ".join(p.name for p in paths)
        extra = " ".join(trace.meta.get("notes", [])[:1])
        raise NoKernelsError(
            f"{names}: no GPU kernel activity in the trace (was GPU tracing on? "
            f"nsys: -t cuda; torch.profiler: ProfilerActivity.CUDA){'; ' + extra if extra else ''}"
        )
    return trace


__all__ = ["load_trace", "detect", "merge", "READERS", "FORMATS", "conform"]
