"""SKILL.md and README.md stay true to the CLI: every command they show runs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA, REPO

from advisor.cli import cli

SKILL = REPO / "SKILL.md"
TRACE = DATA / "h200" / "tail.kineto.json.gz"


def skill_commands() -> list[str]:
    text = SKILL.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]


def test_skill_frontmatter():
    text = SKILL.read_text(encoding="utf-8")
    m = re.match(r"---\nname: (\S+)\ndescription: (.+?)\n---\n", text, flags=re.S)
    assert m and m.group(1) == "advisor" and "Use when" in m.group(2)
    for sid in ("small_grid_long_k", "tail_wave", "launch_overhead", "hopper_no_ws", "exposed_comm",
                "split_k", "stream_k", "persistent", "warp_specialization", "comm_overlap"):
        assert f"`{sid}`" in text, sid


def test_skill_ids_match_the_rules():
    from advisor.rules import load_rules

    text = SKILL.read_text(encoding="utf-8")
    for rule in load_rules().values():
        if rule.symptom != "gate":
            assert f"| `{rule.symptom}` |" in text and f"`{rule.strategy}`" in text


def test_every_skill_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\nprint((torch.ones(4) * 2).sum().item())\n")
    cmds = skill_commands()
    assert len(cmds) >= 8
    runner = CliRunner()
    for cmd in cmds:
        argv = shlex.split(cmd.replace("TRACE", str(TRACE)))
        if argv[0] == "advisor":
            args = argv[1:]
            if args[0] == "profile":
                # No nsys and no GPU here: the PyTorch profiler records no kernels, and the
                # command must say so in one line (exit 2), after profiling the program.
                args = ["profile", "--kineto", *args[1:]]
            r = runner.invoke(cli, args)
            if args[0] == "profile":
                assert r.exit_code == 2 and "no GPU kernel activity" in r.output, (cmd, r.output)
                assert (tmp_path / "prof" / "profile.json.gz").is_file()
                continue
            assert r.exit_code == 0, (cmd, r.output[-2000:], r.exception)
        elif argv[0] == "python":
            # The full 256x256x131072 check takes minutes on the CPU interpreter; the same
            # code path on a small shape keeps the test quick.
            env = dict(os.environ, TRITON_INTERPRET="1")
            p = subprocess.run([sys.executable, *argv[1:], "--shape", "40x24x512"], env=env, capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, (cmd, p.stderr[-2000:])
            assert "check ok" in p.stdout
        else:
            pytest.fail(f"unexpected command in SKILL.md: {cmd}")
    assert (tmp_path / "variant.py").is_file() and (tmp_path / "report" / "report.md").is_file()


def test_readme_states_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150, "the README is for users: results go to docs/"
    assert "pip install . && advisor diagnose --example" in text
    assert "pip install -r requirements-test.txt && python -m pytest -q" in text
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -r requirements-test.txt && python -m pytest -q" in ci
    # the README says how to run every test, and .ci/run runs the slow tier after the fast one
    # and fails if either failed
    assert 'python -m pytest -q -m ""' in text
    assert "python -m pytest -q -m slow || status=$?" in ci and ci.rstrip().endswith('exit "$status"')


def test_readme_report_excerpt_is_what_diagnose_prints():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"`advisor diagnose --example`.*?```\n(.*?)```", text, flags=re.S).group(1)
    rows = [line for line in block.splitlines() if line.startswith("|")]
    assert len(rows) >= 3
    r = CliRunner().invoke(cli, ["diagnose", "--example"])
    assert r.exit_code == 0, r.output
    for row in rows:
        assert row in r.output, row


def test_readme_names_real_commands_and_files():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        for name in re.findall(r"`advisor ([a-z]+)\b", line):
            assert name in cli.commands or "(coming)" in line, (name, line)
    links = re.findall(r"\]\(([^)#]+)\)", text)
    paths = re.findall(r"`((?:docs|bench|workloads|reports|kernels|advisor|rules|templates|experiments)/[\w./-]*)`", text)
    assert links and paths
    for rel in links + paths:
        if "*" not in rel:
            assert (REPO / rel).exists(), rel


def test_run_report_json_holds_the_keys_skill_md_promises(tmp_path, monkeypatch):
    # SKILL.md: "run_report.json holds, per result (kind: gemm ...; grouped ...): table, winner,
    # recommended, verdict, variant, variant_knobs, model, counters"

    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    r = CliRunner().invoke(cli, ["diagnose", "--example", "--run", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    text = SKILL.read_text(encoding="utf-8")
    promised = re.search(r"`run_report.json` holds, per result.*?: `table` \(.*?\), (.*?)\.\n", text, flags=re.S).group(1)
    keys = {"kind", "shape", "table", *re.findall(r"`(\w+)`(?: \([^)]*\))?(?:,|$| \()", promised)}
    assert {"winner", "recommended", "verdict", "variant", "variant_knobs", "model", "counters"} <= keys, keys
    results = json.loads((tmp_path / "run_report.json").read_text())["results"]
    assert {x["kind"] for x in results} == {"gemm", "grouped"}
    for x in results:
        assert keys <= set(x), (x["kind"], keys - set(x))
