"""Loading JSON trace files (plain or gzip, told apart by content) and converting their
numbers without losing precision. Shared by the Kineto and rocprofv3 JSON readers."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic (whatever its name)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read ({exc.strerror or exc})") from None
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{path.name}: truncated or corrupt gzip data ({exc})") from None


def load_json(path: Path, what: str) -> Any:
    """Parse the JSON document in `path`; a truncated or corrupt file is a one-line
    TraceError naming `what` (e.g. "PyTorch profiler") and where parsing stopped."""
    data = read_bytes(path)
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path.name}: truncated or corrupt {what} JSON ({exc.msg} at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise TraceError(f"{path.name}: corrupt {what} JSON ({exc})") from None


def to_float(values: Sequence[Any]) -> np.ndarray:
    """float64 array of `values` (numbers or numeric strings); anything else becomes NaN."""
    try:
        return np.asarray(values, dtype="float64")
    except (TypeError, ValueError):
        return pd.to_numeric(pd.Series(list(values), dtype="object"), errors="coerce").to_numpy(
            dtype="float64", na_value=np.nan
        )


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (float64, finite) to integer nanoseconds, rounded to the nearest ns.

    Splits off the integer part first: multiplying a large timestamp such as
    1752830085464752.5 us by 1000 in float64 would round to a multiple of 256 ns, while the
    integer part times 1000 is exact in int64 and the fraction keeps its own precision."""
    whole = np.floor(us)
    frac = us - whole
    return whole.astype("int64") * 1000 + np.rint(frac * 1000.0).astype("int64")


def to_int(values: Sequence[Any] | np.ndarray | pd.Series) -> pd.Series:
    """Nullable Int64 series of `values`; entries that are not whole numbers become <NA>.

    Python ints go straight into the Int64 array (no float64 detour, so nanosecond
    timestamps beyond 2**53 stay exact); numeric strings are parsed; floats are rounded."""
    index = None
    if isinstance(values, pd.Series):
        index = values.index
        if isinstance(values.dtype, pd.Int64Dtype):
            return values
        if values.dtype.kind in "iub":
            return values.astype("Int64")
        if values.dtype.kind == "f":
            return values.round().astype("Int64")
        values = values.tolist()
    elif isinstance(values, np.ndarray):
        if values.dtype.kind in "iub":
            return pd.Series(values.astype("int64")).astype("Int64")
        if values.dtype.kind == "f":
            return pd.Series(np.round(values)).astype("Int64")
        values = values.tolist()
    else:
        values = list(values)
    try:
        arr = pd.array(values, dtype="Int64")
    except (TypeError, ValueError, OverflowError):
        s = pd.to_numeric(pd.Series(values, dtype="object"), errors="coerce")
        if s.dtype.kind == "f":
            s = s.round()
        arr = s.astype("Int64").array
    return pd.Series(arr, index=index)


def handle(value: Any) -> Any:
    """rocprofiler-sdk writes ids either as plain numbers or as {"handle": N}; return N."""
    if isinstance(value, dict):
        return value.get("handle")
    return value
