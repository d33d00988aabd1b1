"""context.group_ids numbers launch groups as groupby(dropna=False, sort=False).ngroup() did."""

import numpy as np
import pandas as pd

from advisor.symptoms.context import group_ids


def test_group_ids_match_groupby_ngroup_with_missing_values():
    rng = np.random.default_rng(7)
    n = 5000
    cols = {
        "a": pd.array(rng.integers(0, 4, n), dtype="Int64"),
        "b": pd.array(rng.integers(0, 3, n), dtype="Int32"),
        "c": rng.integers(-1, 5, n),
        "d": pd.array(rng.integers(0, 2, n), dtype="Int64"),
    }
    for name in ("a", "b", "d"):
        cols[name][rng.random(n) < 0.2] = pd.NA  # missing values are a group of their own
    df = pd.DataFrame(cols)
    want = df.groupby(list(df.columns), dropna=False, sort=False).ngroup().to_numpy()
    got = group_ids([df[c] for c in df.columns])
    assert want.max() > 50  # many groups, NA in several keys
    np.testing.assert_array_equal(got, want)


def test_group_ids_single_column_first_appearance():
    got = group_ids([pd.Series([5, 3, 5, None, 3, None], dtype="Int64")])
    np.testing.assert_array_equal(got, [0, 1, 0, 2, 1, 2])
