"""`--rules DIR` pointing at an edited copy of rules/: a broken copy is one line and exit 2,
never a traceback or a rule silently dropped."""

from __future__ import annotations

from pathlib import Path

import re
import shutil

import pytest
from click.testing import CliRunner
from conftest import REPO

from advisor.cli import cli


def copy_rules(tmp_path):
    d = tmp_path / "rules"
    shutil.copytree(REPO / "rules", d)
    return d


def edit(path, pattern, repl):
    text = path.read_text(encoding="utf-8")
    new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    assert n == 1, pattern
    path.write_text(new, encoding="utf-8")


def diagnose_with(d):
    return CliRunner().invoke(cli, ["diagnose", "--example", "--rules", str(d)])


def test_an_unedited_copy_gives_the_bundled_result(tmp_path):
    d = copy_rules(tmp_path)
    r = diagnose_with(d)
    assert r.exit_code == 0, r.output
    assert r.output == CliRunner().invoke(cli, ["diagnose", "--example"]).output


@pytest.mark.parametrize(
    "file, pattern, repl, says",
    [
        # a list where the rule compares a number
        ("tail_wave.toml", r"^(\[thresholds\.min_waves\]\nvalue = )(\S+)", r"\1[\2]", "min_waves"),
        # a number where the rule wants a list of compute-capability majors is fine (one
        # value), but non-finite numbers compare false everywhere and silently disable a rule
        ("small_grid_long_k.toml", r"^(\[thresholds\.\w+\]\nvalue = )(\S+)", r"\1nan", "finite"),
        ("tail_wave.toml", r"^(\[thresholds\.\w+\]\nvalue = )(\S+)", r"\1inf", "finite"),
        # a misspelt symptom id would drop the rule without a word
        ("tail_wave.toml", r'^symptom = "tail_wave"', 'symptom = "tail_wav"', "tail_wav"),
        # --run would time a schedule that does not exist (or the baseline as a candidate)
        ("tail_wave.toml", r"^candidates = .*$", 'candidates = ["stream_kk"]', "candidates"),
        ("hopper_no_ws.toml", r"^candidates = .*$", 'candidates = ["dp"]', "candidates"),
    ],
)
def test_a_broken_copy_is_one_line_and_exit_2(tmp_path, file, pattern, repl, says):
    d = copy_rules(tmp_path)
    edit(d / file, pattern, repl)
    for args in (["diagnose", "--example", "--rules", str(d)], ["rules", "--rules", str(d)]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 2, (args, r.output, r.exception)
        assert r.output.startswith("advisor: error: ") and len(r.output.strip().splitlines()) == 1, r.output
        assert says in r.output and file in r.output, r.output


def test_a_single_arch_major_still_works(tmp_path):
    # the planted tail GEMM (our dp Triton kernel on the H200) keeps a small WS finding
    d = copy_rules(tmp_path)
    edit(d / "hopper_no_ws.toml", r"^value = \[9\]", "value = 9")
    trace = str(Path(__file__).parent / "data" / "h200" / "tail.sqlite.gz")
    r = CliRunner().invoke(cli, ["diagnose", trace, "--rules", str(d), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert "hopper_no_ws" in r.output
