"""String tests on trace columns, evaluated once per distinct value.

A trace repeats a few dozen kernel, API and NVTX names millions of times: a 1M-kernel export
has 1M runtime rows but a handful of distinct API names. `pandas.Series.str.contains` runs
the regex on every row (about 0.4 us each); factorizing first and testing the distinct
values costs one hash per row instead, which made `advisor diagnose` on a 1M-kernel export
several seconds faster (docs/scale.md).
"""

from __future__ import annotations

import ctypes
import re
import sys

import numpy as np
import pandas as pd

# Characters of a trace string that regexes look at. Real kernel names run to a few hundred
# characters (the longest CUTLASS/cuDNN template names seen in the corpus ~2,000); a hostile
# trace can hold megabyte names, and a regex that searches from every position costs
# O(length^2) there. What decides a match (library prefix, tile, op name) is near the start.
MATCH_CHARS = 4096


def factorize(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize(s, use_na_sentinel=True) for a column of strings: (codes, uniques), codes
    -1 for missing values, uniques in order of first appearance.

    Readers hand out the same Python string object for every row with the same name (nsys
    maps name ids through one table), so rows are first grouped by object identity (an
    int64 hash) and only one representative per object is hashed as a string: 0.3 s ->
    under 0.1 s for a million kernel names. Equal strings held in different objects still
    get one code."""
    # missing values stay what the column holds (pd.NA, None, NaN): pd.factorize gives each
    # of them -1 below; asking for na_value=None ran an isna over every row
    values = s.to_numpy(dtype=object)
    n = len(values)
    if n == 0:
        return np.empty(0, dtype=np.intp), np.empty(0, dtype=object)
    id_codes, _ = pd.factorize(object_ids(values))
    first = np.empty(id_codes.max() + 1, dtype=np.intp)
    first[id_codes[::-1]] = np.arange(n - 1, -1, -1)  # last write wins: the first occurrence
    rep_codes, uniques = pd.factorize(values[first], use_na_sentinel=True)
    return rep_codes[id_codes], np.asarray(uniques, dtype=object)


_POINTERS_ARE_IDS = sys.implementation.name == "cpython" and np.dtype(object).itemsize == 8


def object_ids(values: np.ndarray) -> np.ndarray:
    """id() of each element of an object array, as int64. In CPython an object array holds
    the objects' addresses, which are their ids: read as integers, a copy of that memory
    (map(id, ...) took ~0.1 s per million rows, ~0.7 s of a diagnosis at 2M events)."""
    n = len(values)
    if _POINTERS_ARE_IDS and values.ndim == 1 and values.flags.c_contiguous and n:
        return np.frombuffer((ctypes.c_int64 * n).from_address(values.ctypes.data), dtype=np.int64).copy()
    return np.fromiter(map(id, values), dtype=np.int64, count=n)


# contains() works through a column this many rows at a time: factorize's arrays (object
# ids, codes) cost ~30 bytes a row, ~300 MB at once for a 10M-row column
_CONTAINS_CHUNK = 1 << 20


def contains(s: pd.Series, pattern: str | re.Pattern) -> pd.Series:
    """Boolean Series: whether each value of `s` matches the regex `pattern` anywhere
    (`re.search`), False for missing values; same index as `s`."""
    n = len(s)
    if n <= _CONTAINS_CHUNK:
        return pd.Series(_contains(s, pattern), index=s.index)
    out = np.empty(n, dtype=bool)
    for lo in range(0, n, _CONTAINS_CHUNK):
        out[lo:lo + _CONTAINS_CHUNK] = _contains(s.iloc[lo:lo + _CONTAINS_CHUNK], pattern)
    return pd.Series(out, index=s.index)


def _contains(s: pd.Series, pattern: str | re.Pattern) -> np.ndarray:
    codes, uniques = factorize(s)
    if len(uniques) == 0:
        return np.zeros(len(s), dtype=bool)
    hit = pd.Series(np.asarray(uniques, dtype=object)).map(str).str.slice(0, MATCH_CHARS).str.contains(pattern, regex=True).to_numpy(dtype=bool)
    return np.where(codes >= 0, hit[np.maximum(codes, 0)], False)
