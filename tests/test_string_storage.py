"""The same diagnosis whether pandas stores text in Python objects or in Arrow (pyarrow
installed or not: pandas 3 then switches its default string storage). Frames whose text
columns mixed the two storages failed to concatenate on the H200 machine (pandas 3.0.6 with
pyarrow): advisor.model.STRING pins one storage."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import DATA

pytest.importorskip("pyarrow")

# pandas reads pyarrow as missing when its module entry is None
NO_ARROW = "import sys; sys.modules['pyarrow'] = None\n"
RUN = """
import json
from advisor.diagnose.diagnosis import diagnose
from advisor.traces import load_trace
import pandas as pd
out = {}
for name in NAMES:
    d = diagnose(load_trace(name, cache_dir=CACHE))
    out[name] = sorted((f.symptom, f.strategy, f.kernel, f.launches, f.total_ns, f.est_savings_ns) for f in d.findings)
out["storage"] = pd.array(["x"], dtype="string").dtype.storage
print(json.dumps(out))
"""


def _diagnose(tmp_path, names, block_arrow):
    code = (NO_ARROW if block_arrow else "") + f"NAMES = {names!r}\nCACHE = {str(tmp_path)!r}\n" + RUN
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_same_findings_with_and_without_pyarrow(tmp_path):
    names = [str(DATA.parents[1] / "advisor" / "examples" / "h200_planted_mixed.sqlite.gz")] + [
        str(DATA / "h200" / n) for n in ("small_gemms.kineto.json.gz", "tiny_stream.sqlite.gz", "two_procs.sqlite.gz")
    ]
    arrow = _diagnose(tmp_path, names, block_arrow=False)
    plain = _diagnose(tmp_path, names, block_arrow=True)
    assert arrow.pop("storage") == "pyarrow" and plain.pop("storage") == "python"  # both storages really ran
    assert arrow == plain
    assert all(arrow[n] for n in names)  # every trace has findings to compare
