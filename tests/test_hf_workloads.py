"""workloads/hf_models.py, the capture driver for third-party models (issues 32, 36, 39): its
command line works without transformers/timm/peft (they are imported by the scenarios only),
every pair has one "before" to measure its fix against, the nsys exports are named after the
scenario range they hold, and, where the packages are installed, the scenarios run on the CPU."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "workloads" / "hf_models.py"
HEAVY = ("transformers", "timm", "peft", "torchvision")


def _hf():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("hf_models_under_test", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up while being made
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(SCRIPT.parent))


def _run_blocked(*args: str) -> subprocess.CompletedProcess:
    """Run hf_models.py with the optional packages made unimportable (as on a machine without them)."""
    code = ("import runpy, sys; sys.modules.update({m: None for m in %r}); sys.argv = %r; "
            "runpy.run_path(%r, run_name='__main__')" % (HEAVY, [str(SCRIPT), *args], str(SCRIPT)))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=SCRIPT.parent)


def test_help_and_list_without_the_model_packages():
    r = _run_blocked("--help")
    assert r.returncode == 0, r.stderr
    assert "--profiler" in r.stdout and "gpt2_train_padded" in r.stdout
    r = _run_blocked("A", "--list")
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [n for n, *_ in rows][:2] == ["gpt2_train", "gpt2_train_padded"]
    assert {g for _, g, _, _ in rows} == {"A"}


def test_a_scenario_whose_package_is_missing_fails_alone(tmp_path):
    r = _run_blocked("gpt2_train", "sdpa_decode_cudnn", "--device", "cpu", "--tiny", "--warmup", "1",
                     "--out", str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "failed: gpt2_train"  # the SDPA one ran (torch only)
    meta = json.loads((tmp_path / "hf_gpt2_train.meta.json").read_text())
    assert "transformers" in meta["errors"]["none"]
    assert json.loads((tmp_path / "hf_sdpa_decode_cudnn.meta.json").read_text())["info"]["backend"] == "math (cpu)"


def test_unknown_scenario_is_a_one_line_error():
    r = _run_blocked("gpt3_train", "--list")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("unknown scenario gpt3_train")
    assert len(r.stderr.strip().splitlines()) == 1


def test_every_pair_has_one_before_and_its_afters_say_the_fix():
    hf = _hf()
    pairs: dict[str, list] = {}
    for s in hf.SCENARIOS.values():
        pairs.setdefault(s.pair, []).append(s)
    for pair, members in pairs.items():
        roles = [s.role for s in members]
        if set(roles) == {"control"}:
            continue
        assert roles.count("before") == 1, pair
        for s in members:
            assert (s.role == "before") == (s.fix == ""), s.name
    assert set(hf.expand(["A", "B", "C"])) == set(hf.SCENARIOS)
    assert hf.expand(["gpt2_train", "A"])[:2] == ["gpt2_train", "gpt2_train_padded"]


def _fake_export(path: Path, label: str, registered: bool):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE NVTX_EVENTS (start INT, end INT, text TEXT, textId INT)")
    con.execute("INSERT INTO StringIds VALUES (7, ?)", (label,))
    con.execute("INSERT INTO NVTX_EVENTS VALUES (0, 9, 'aten::mm, seq = 1', NULL)")
    if registered:
        con.execute("INSERT INTO NVTX_EVENTS VALUES (0, 10, NULL, 7)")
    else:
        con.execute("INSERT INTO NVTX_EVENTS VALUES (0, 10, ?, NULL)", (label,))
    con.commit()
    con.close()


def test_label_nsys_names_each_export_after_its_scenario_range(tmp_path):
    hf = _hf()
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    out.mkdir()
    _fake_export(raw / "hf_A_1.sqlite", "hf_scenario resnet50_train", registered=False)
    _fake_export(raw / "hf_A_2.sqlite", "hf_scenario resnet50_train_cl", registered=True)
    assert hf.label_nsys(raw, out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["hf_resnet50_train.sqlite.gz", "hf_resnet50_train_cl.sqlite.gz"]
    with gzip.open(out / "hf_resnet50_train_cl.sqlite.gz") as f:
        assert f.read(16) == b"SQLite format 3\x00"
    _fake_export(raw / "hf_A_3.sqlite", "some other range", registered=False)
    assert hf.label_nsys(raw, out) == 1  # an export without its label is reported, not guessed


def test_capture_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "workloads" / "capture_hf.sh")]).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("scenario,profiler", [("gpt2_train", "kineto"), ("lora_llama_train", "none"),
                                               ("lora_llama_train_bf16", "none"), ("sdpa_decode_cudnn", "kineto")])
def test_scenario_runs_on_cpu_tiny(tmp_path, scenario, profiler):
    for mod in ("transformers", "peft"):
        pytest.importorskip(mod)
    r = subprocess.run([sys.executable, str(SCRIPT), scenario, "--device", "cpu", "--tiny", "--time", "--reps", "3",
                        "--warmup", "1", "--profiler", profiler, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = [json.loads(line) for line in (tmp_path / "timings.jsonl").read_text().splitlines()]
    assert row["scenario"] == scenario and row["step_ms"]["n"] == 3 and row["step_ms"]["median"] > 0
    meta = json.loads((tmp_path / f"hf_{scenario}.meta.json").read_text())
    assert meta["pair"] == row["pair"] and meta["info"]
    if scenario.startswith("lora_llama"):  # peft upcasts adapters to fp32 by default; the fix keeps bf16
        assert meta["info"]["adapter_dtypes"] == (["bfloat16"] if scenario.endswith("_bf16") else ["float32"])
    if profiler == "kineto":
        with gzip.open(tmp_path / f"hf_{scenario}.kineto.json.gz") as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert f"hf_scenario {scenario}" in names


@pytest.mark.slow
def test_capture_script_packs_one_tarball_even_when_nsys_fails(tmp_path):
    """capture_hf.sh on two torch-only scenarios on the CPU, with an `nsys` that fails: the timing
    and Kineto steps still run, and everything lands in OUTDIR/hf_GROUP.tar.gz alone."""
    import os
    import tarfile

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nsys").write_text("#!/bin/sh\necho fake nsys >&2\nexit 1\n")
    (fake / "nsys").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", PYTHON=sys.executable,
               HF_ARGS="--device cpu --tiny --warmup 1 --reps 3", TMPDIR=str(tmp_path))
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "workloads" / "capture_hf.sh"), "sdpa_decode_flash,sdpa_decode_cudnn",
                        str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["hf_sdpa_decode_flash_sdpa_decode_cudnn.tar.gz"]
    with tarfile.open(out / "hf_sdpa_decode_flash_sdpa_decode_cudnn.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        timings = tar.extractfile("./timings.jsonl").read().decode().splitlines()
    assert {"hf_sdpa_decode_flash.kineto.json.gz", "hf_sdpa_decode_cudnn.kineto.json.gz", "timings.jsonl",
            "hf_sdpa_decode_cudnn.meta.json", "nsys.log", "time.log", "kineto.log"} <= names
    assert [json.loads(t)["scenario"] for t in timings] == ["sdpa_decode_flash", "sdpa_decode_cudnn"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("hf_")]  # the scratch folder is gone
