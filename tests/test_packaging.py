"""The wheel carries what a non-editable install needs: rules, templates, kernels and the
bundled example, under advisor/_data and advisor/examples (README's first command)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_contents(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = tmp_path.glob("advisor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rule in (REPO / "rules").glob("*.toml"):
        assert f"advisor/_data/rules/{rule.name}" in names
    for tpl in (REPO / "templates").glob("*.j2"):
        assert f"advisor/_data/templates/{tpl.name}" in names
    for k in (REPO / "kernels").glob("*.py"):
        assert f"advisor/_data/kernels/{k.name}" in names
    assert "advisor/examples/h200_planted_mixed.sqlite.gz" in names
    assert not any(n.startswith(("tests/", "bench/", "workloads/", "tools/")) for n in names)
    assert not any("sm90_compile_check" in n for n in names)  # a maintainer tool (tools/), not the library
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    core = [line for line in text.splitlines() if line.startswith("Requires-Dist") and "extra ==" not in line]
    assert not any("torch" in line or "triton" in line for line in core), core  # laptops need no GPU stack
