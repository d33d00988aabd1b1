"""advisor.symptoms.strings: factorizing trace columns by object identity first."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from advisor.model import STRING
from advisor.symptoms.strings import contains, factorize, object_ids


def test_object_ids_are_ids():
    shared = "kernel_a"
    values = np.array([shared, None, "b" * 3, pd.NA, 3.5, shared, np.nan], dtype=object)
    for arr in (values, values[::2], values[1:], values[:0], np.asfortranarray(values)):
        assert object_ids(arr).tolist() == [id(v) for v in arr]
        assert object_ids(arr).dtype == np.int64


@pytest.mark.parametrize("dtype", [STRING, "str", object])
def test_factorize_matches_pandas(dtype):
    """Codes and uniques as pd.factorize gives them (first appearance, -1 for any missing
    value), whether equal strings share one object or not."""
    a = "x" * 5
    b = "".join(["x"] * 5)  # equal to `a`, another object
    values = [a, None, "y", b, np.nan, "y", a, pd.NA if dtype is STRING else None, "z"]
    s = pd.Series(values, dtype=dtype)
    codes, uniques = factorize(s)
    want_codes, want_uniques = pd.factorize(s.astype(object).where(s.notna(), None), use_na_sentinel=True)
    assert codes.tolist() == want_codes.tolist() == [0, -1, 1, 0, -1, 1, 0, -1, 2]
    assert list(uniques) == list(want_uniques) == ["xxxxx", "y", "z"]
    assert contains(s, "^x").tolist() == [True, False, False, True, False, False, True, False, False]


def test_factorize_empty_and_all_missing():
    codes, uniques = factorize(pd.Series([], dtype=STRING))
    assert len(codes) == 0 and len(uniques) == 0
    codes, uniques = factorize(pd.Series([None, None], dtype=STRING))
    assert codes.tolist() == [-1, -1] and len(uniques) == 0
