"""String tests on trace columns, evaluated once per distinct value.

A trace repeats a few dozen kernel, API and NVTX names millions of times: a 1M-kernel export
has 1M runtime rows but a handful of distinct API names. `pandas.Series.str.contains` runs
the regex on every row (about 0.4 us each); factorizing first and testing the distinct
values costs one hash per row instead, which made `advisor diagnose` on a 1M-kernel export
several seconds faster (bench/SCALE.md).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd


def contains(s: pd.Series, pattern: str | re.Pattern) -> pd.Series:
    """Boolean Series: whether each value of `s` matches the regex `pattern` anywhere
    (`re.search`), False for missing values; same index as `s`."""
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    if len(uniques) == 0:
        return pd.Series(np.zeros(len(s), dtype=bool), index=s.index)
    hit = pd.Series(np.asarray(uniques, dtype=object)).map(str).str.contains(pattern, regex=True).to_numpy(dtype=bool)
    return pd.Series(np.where(codes >= 0, hit[np.maximum(codes, 0)], False), index=s.index)
