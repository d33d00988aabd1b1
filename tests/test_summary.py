"""`advisor summary` keeps launches of one kernel name apart when their grids differ
(issue 32, class 10): a per-name row hid 887 us 4-CTA GEMM calls under a 143-CTA median."""

from __future__ import annotations

import gzip
import json

from click.testing import CliRunner
from conftest import DATA

from advisor.cli import cli
from advisor.report.summary import summarize
from advisor.traces import load_trace

MIXED = DATA / "h200" / "mixed.kineto.json.gz"


def raw_launches(path, name):
    """(grid, dur_us) of every `name` kernel event in the raw Kineto JSON."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return [(tuple(e["args"]["grid"]), e["dur"]) for e in doc["traceEvents"]
            if e.get("cat") == "kernel" and e.get("name") == name]


def test_summary_splits_one_name_by_grid():
    launches = raw_launches(MIXED, "dp_gemm_kernel")
    grids = sorted({g for g, _ in launches})
    assert grids == [(4, 1, 1), (143, 1, 1)]  # what the raw trace holds
    info = summarize(load_trace(MIXED), top=50)
    rows = [t for t in info["top_kernels"] if t["name"] == "dp_gemm_kernel"]
    assert sorted(tuple(r["grid"]) for r in rows) == grids
    for r in rows:
        mine = [d for g, d in launches if g == tuple(r["grid"])]
        assert r["count"] == len(mine)
        assert abs(r["total_ns"] - sum(mine) * 1000) <= len(mine)  # us floats rounded to ns
        assert r["configs_of_name"] == 2
    small = next(r for r in rows if r["grid"] == [4, 1, 1])
    assert small["median_ns"] > 800_000  # the 4-CTA calls keep their own ~835 us median
    # the shape comes from the trace's ranges: the 4-CTA calls are the long-K GEMM
    assert small["shape"] == {"M": 256, "N": 256, "K": 131072, "dtype": "bf16"}


def test_summary_text_has_one_line_per_grid():
    r = CliRunner().invoke(cli, ["summary", str(MIXED), "--top", "5"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.endswith("dp_gemm_kernel")]
    assert len(lines) == 2
    assert any("4x1x1" in ln and "256x256x131072" in ln for ln in lines)
    assert any("143x1x1" in ln and "1664x1408x8192" in ln for ln in lines)
