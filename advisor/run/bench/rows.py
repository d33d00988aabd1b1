"""Measurement rows: the long-format records every benchmark table is derived from.

One row is one (shape, provider, config) measurement or failure. Rows are plain dicts with
the columns in `COLUMNS` (units in the names), so they go to CSV, JSON and pandas alike.
Pure Python: nothing here imports torch or triton.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from ...basics import DTYPES, parse_shape  # noqa: F401  (parse_shape: the one parser, re-exported for the bench scripts)

# Order of the CSV columns. Later additions go at the end so old files stay readable.
COLUMNS = [
    "suite",  # tail | skinny | balanced | grouped | ceiling | timer_check | adhoc ...
    "shape",  # "MxNxK" (grouped: "64 GEMMs 128..512 seed 0"; copy: "<bytes>B")
    "M", "N", "K",
    "dtype",  # bf16 | fp16 | fp32
    "provider",  # torch.matmul | dp | split_k | persistent | stream_k | warp_specialization | grouped ...
    "config",  # JSON text of the schedule's Config dataclass ("" for library calls)
    "phase",  # search: one of the candidates tried; final: one of a provider's best 3 re-checked and re-timed in interleaved rounds
    "status",  # ok | compile_error | launch_error | wrong | timeout | skipped
    "error",  # short reason when status != ok
    "median_us", "p20_us", "p80_us",
    "tflops",  # flops / median
    "gbps",  # bytes / median, bytes = (MK + KN + MN) x element size (each operand moved once)
    "rel_err",  # max over the check sets of ||out - ref||_F / ||ref||_F against float64
    "flops", "bytes",
    "hbm_floor_us",  # bytes / copy bandwidth measured in the same run ("" when not measured)
    "first_call_s",  # wall time of the first call: compile (or cache load) + one run
    "timer",  # do_bench | events | cpu
    "device", "sm_count", "date", "torch", "triton", "run_id",
]

STATUSES = ("ok", "compile_error", "launch_error", "wrong", "timeout", "skipped")

_INT_COLUMNS = {"M", "N", "K", "sm_count"}
_FLOAT_COLUMNS = {"median_us", "p20_us", "p80_us", "tflops", "gbps", "rel_err", "flops", "bytes",
                  "hbm_floor_us", "first_call_s"}

DTYPE_NAMES = tuple(DTYPES)


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"


def shape_text(M: int, N: int, K: int) -> str:
    return f"{M}x{N}x{K}"


def config_json(config) -> str:
    """Stable JSON text of a config: a dataclass, a dict, or None ("")."""
    if config is None:
        return ""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if isinstance(config, str):
        return config
    return json.dumps(config, sort_keys=True, default=str)


def gemm_flops(M: int, N: int, K: int) -> float:
    return 2.0 * M * N * K


def gemm_bytes(M: int, N: int, K: int, elt: int) -> float:
    """Fewest bytes a GEMM moves through memory: each operand read once, C written once."""
    return float(elt) * (M * K + K * N + M * N)


def make_row(*, suite: str, shape: str, M, N, K, dtype: str, provider: str, config="",
             status: str, error: str = "", phase: str = "search", median_ms=None, p20_ms=None,
             p80_ms=None, flops=None, bytes_moved=None, rel_err=None, first_call_s=None,
             hbm_gbps=None, timer: str = "", env: dict | None = None) -> dict:
    """Build one row; derived columns (us, TFLOP/s, GB/s, HBM floor) are computed here."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    env = env or {}
    med_us = None if median_ms is None else median_ms * 1e3
    row = {
        "suite": suite, "shape": shape, "M": M, "N": N, "K": K, "dtype": dtype,
        "provider": provider, "config": config_json(config), "phase": phase,
        "status": status, "error": short_error(error),
        "median_us": med_us,
        "p20_us": None if p20_ms is None else p20_ms * 1e3,
        "p80_us": None if p80_ms is None else p80_ms * 1e3,
        "tflops": flops / (med_us * 1e-6) / 1e12 if flops and med_us else None,
        "gbps": bytes_moved / (med_us * 1e-6) / 1e9 if bytes_moved and med_us else None,
        "rel_err": rel_err,
        "flops": flops, "bytes": bytes_moved,
        "hbm_floor_us": bytes_moved / (hbm_gbps * 1e9) * 1e6 if bytes_moved and hbm_gbps else None,
        "first_call_s": first_call_s,
        "timer": timer,
        "device": env.get("device", ""), "sm_count": env.get("sm_count"),
        "date": env.get("date") or now_iso(), "torch": env.get("torch", ""),
        "triton": env.get("triton", ""), "run_id": env.get("run_id", ""),
    }
    if status != "ok":  # a failed variant carries no time: it can never be ranked
        for k in ("median_us", "p20_us", "p80_us", "tflops", "gbps", "hbm_floor_us"):
            row[k] = None
    return row


def short_error(text, limit: int = 300) -> str:
    """One line, at most `limit` characters: enough to tell failures apart in a table."""
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    return str(v)


def append_csv(path, rows: Iterable[dict]) -> Path:
    """Append rows to a CSV (gzip-compressed where the name ends in .gz), writing the header
    only when the file is new or empty.

    If the existing header lacks columns these rows have (an older schema), the file is
    rewritten once with the union of columns (old order first), so there is always exactly
    one header and no existing value is lost. The whole file is written anew (temp file +
    rename, advisor.safeio), so a symlink planted at `path` is replaced, not written through.
    """
    from ...safeio import read_regular, write_file

    path = Path(path)
    rows = list(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = read_regular(path) or b""
    old_text = (gzip.decompress(old) if old and _gz(path) else old).decode("utf-8", "replace")
    header = next(csv.reader(io.StringIO(old_text)), None) if old_text else None
    keys = list(COLUMNS)
    for r in rows:
        keys += [k for k in r if k not in keys]
    out = io.StringIO(newline="")
    w = csv.writer(out)
    if header is None:
        fields = keys
        w.writerow(fields)
    else:
        missing = [k for k in keys if k not in header and any(k in r for r in rows)]
        fields = header + missing
        if missing:
            w.writerow(fields)
            for r in csv.DictReader(io.StringIO(old_text)):
                w.writerow([r.get(k, "") for k in fields])
        else:
            out.write(old_text if old_text.endswith("\n") else old_text + "\r\n")
    for r in rows:
        w.writerow([_cell(r.get(k)) for k in fields])
    text = out.getvalue()
    # a .gz file is written compressed, without a time stamp (the same rows, the same bytes)
    write_file(path, gzip.compress(text.encode("utf-8"), mtime=0) if _gz(path) else text)
    return path


def _gz(path: Path) -> bool:
    return path.suffix == ".gz"


def open_text(path):
    """A CSV file for reading as text, gzip-compressed where its name ends in .gz (the committed
    bench/results/h200.csv.gz)."""
    path = Path(path)
    if _gz(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(newline="", encoding="utf-8")


def _convert(key: str, value: str):
    if value is None or value == "":
        return None
    if key in _INT_COLUMNS:
        try:
            return int(value)
        except ValueError:
            return value
    if key in _FLOAT_COLUMNS:
        try:
            return float(value)
        except ValueError:
            return value
    return value


def read_csv(path, *, convert: bool = True) -> list[dict]:
    """Rows of a CSV written by `append_csv`; numeric columns become int/float, blanks None."""
    path = Path(path)
    if not path.exists():
        return []
    with open_text(path) as f:
        rows = list(csv.DictReader(f))
    if convert:
        rows = [{k: _convert(k, v) for k, v in r.items()} for r in rows]
    return rows


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "inf"/"nan": strict JSON has no literal for them
    return v


def write_json(path, rows: Iterable[dict]) -> Path:
    """All rows as one strict-JSON list (non-finite floats as the strings "inf"/"nan")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [{k: _json_safe(v) for k, v in r.items()} for r in rows]
    from ...safeio import write_file

    write_file(path, json.dumps(data, indent=1) + "\n")
    return path


def append_jsonl(path, rows: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps({k: _json_safe(v) for k, v in r.items()}) + "\n")
    return path
