"""The CLI's environment variables and its behaviour when its reader goes away."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

from click.testing import CliRunner

from advisor.cli import cli

# rocprofv3 kernel_trace.csv (2024-05 header, rocprofiler-sdk generateCSV.cpp): no SM count
HEADER = ["Kind", "Agent_Id", "Queue_Id", "Kernel_Id", "Kernel_Name", "Correlation_Id", "Start_Timestamp",
          "End_Timestamp", "Private_Segment_Size", "Group_Segment_Size", "Workgroup_Size_X", "Workgroup_Size_Y",
          "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]
ROW = ["KERNEL_DISPATCH", 2, 1, 7, "void kern<float>(float*, int)", 100, 1_000_000, 1_050_000, 0, 0, 256, 1, 1,
       1024, 1, 1]


def test_sm_count_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "run_kernel_trace.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([HEADER, ROW])
    r = CliRunner().invoke(cli, ["summary", "--json", str(path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["devices"][0]["sm_count"] is None
    # the README's name, for every command with --sm-count (click alone would want
    # ADVISOR_SUMMARY_SM_COUNT, ADVISOR_DIAGNOSE_SM_COUNT, ...)
    monkeypatch.setenv("ADVISOR_SM_COUNT", "110")
    for command in ("summary", "diagnose"):
        r = CliRunner().invoke(cli, [command, "--json", str(path)])
        assert r.exit_code == 0, r.output
        devices = json.loads(r.output)["devices"]
        assert devices[0]["sm_count"] == 110 and devices[0]["sm_count_source"] == "user", (command, devices)
    assert "ADVISOR_SM_COUNT" in CliRunner().invoke(cli, ["diagnose", "--help"]).output


def test_a_closed_pipe_is_not_an_error():
    # `advisor rules | head -1`: the reader leaves after one line
    proc = subprocess.run(f"{sys.executable} -m advisor.cli rules | head -1", shell=True,
                          capture_output=True, text=True, check=False)
    assert proc.stdout.strip() and "error" not in proc.stderr.lower(), proc.stderr


def test_option_env_names_follow_the_option_not_its_python_name(tmp_path, monkeypatch):
    # README: "any other as ADVISOR_<COMMAND>_<OPTION> (e.g. ADVISOR_DIAGNOSE_TOP=3)"; options
    # whose Python name differs from the flag (--json, --out, --rules, --config) must follow it too
    monkeypatch.setenv("ADVISOR_DIAGNOSE_JSON", "1")
    r = CliRunner().invoke(cli, ["diagnose", "--example"])
    assert r.exit_code == 0 and json.loads(r.output)["findings"], r.output[:300]
    monkeypatch.delenv("ADVISOR_DIAGNOSE_JSON")
    monkeypatch.setenv("ADVISOR_DIAGNOSE_OUT", str(tmp_path / "out"))
    r = CliRunner().invoke(cli, ["diagnose", "--example"])
    assert r.exit_code == 0 and (tmp_path / "out" / "report.json").is_file(), r.output[-300:]
    monkeypatch.setenv("ADVISOR_GENERATE_CONFIG", "SPLIT_K=8")
    r = CliRunner().invoke(cli, ["generate", "split_k", "--shape", "256x256x131072", "-o", str(tmp_path / "v.py")])
    assert r.exit_code == 0 and "SPLIT_K=8" in r.output, r.output
    # the names click derives from the Python names keep working
    monkeypatch.delenv("ADVISOR_GENERATE_CONFIG")
    monkeypatch.delenv("ADVISOR_DIAGNOSE_OUT")
    monkeypatch.setenv("ADVISOR_DIAGNOSE_AS_JSON", "1")
    r = CliRunner().invoke(cli, ["diagnose", "--example", "--top", "1"])
    assert r.exit_code == 0 and len(json.loads(r.output)["findings"]) == 1


def test_generate_takes_the_sm_count_from_the_environment(tmp_path, monkeypatch):
    # README: ADVISOR_SM_COUNT "for every command that takes" --sm-count; generate takes it
    args = ["generate", "split_k", "--shape", "256x256x131072", "-o", str(tmp_path / "v.py")]
    given = CliRunner().invoke(cli, [*args, "--sm-count", "16"])
    monkeypatch.setenv("ADVISOR_SM_COUNT", "16")
    from_env = CliRunner().invoke(cli, args)
    assert given.exit_code == 0 and from_env.exit_code == 0
    knobs = [line for line in from_env.output.splitlines() if line.startswith("knobs:")]
    assert knobs == [line for line in given.output.splitlines() if line.startswith("knobs:")]
    assert "SPLIT_K=32" not in knobs[0]  # what 132 SMs get
    assert "ADVISOR_SM_COUNT" in CliRunner().invoke(cli, ["generate", "--help"]).output


def test_json_with_run_keeps_stdout_one_json_document(tmp_path, monkeypatch):
    # `diagnose --json --run --out DIR`: an agent parses stdout as the JSON contract; the run's
    # markdown report goes to DIR/run_report.md (and .json), not after the JSON on stdout

    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    r = CliRunner().invoke(cli, ["diagnose", "--example", "--json", "--run", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["findings"]
    assert (tmp_path / "run_report.json").is_file() and (tmp_path / "run_report.md").is_file()
    assert "run_report.md" in r.stderr


def test_diagnose_help_names_every_file_it_writes(tmp_path, monkeypatch):
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    monkeypatch.chdir(tmp_path)
    help_text = "".join(CliRunner().invoke(cli, ["diagnose", "--help"]).output.split())  # wrapped anywhere
    r = CliRunner().invoke(cli, ["diagnose", "--example", "--out", "report"])
    assert r.exit_code == 0
    for name in sorted(p.name for p in (tmp_path / "report").iterdir()):
        assert name in help_text, name
    # --run without --out writes into ./advisor-run: the help says where
    r = CliRunner().invoke(cli, ["diagnose", "--example", "--run"])
    assert r.exit_code == 0 and (tmp_path / "advisor-run" / "run_report.md").is_file()
    assert "advisor-run" in help_text and "run_report.md" in help_text


def test_errors_end_in_one_line_and_exit_2(tmp_path):
    # README: errors exit 2 and end in one line on stderr (advisor's own, or click's after a usage hint)
    cases = [
        ["diagnose", str(tmp_path / "missing.json")],
        ["diagnose"],
        ["diagnose", "--example", "--top", "0"],
        ["generate", "split_k", "--shape", "1x1", "-o", str(tmp_path / "v.py")],
        ["generate", "split_k", "--shape", "8x8x8", "--config", "noeq", "-o", str(tmp_path / "v.py")],
        ["bench", "--shape", "8x8x8", "--strategies", "foo"],
    ]
    for args in cases:
        r = CliRunner().invoke(cli, args)
        last = r.stderr.strip().splitlines()[-1]
        assert r.exit_code == 2 and (last.startswith("advisor: error: ") or last.startswith("Error: ")), (args, r.stderr)
