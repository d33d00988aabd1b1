"""The "Next:" commands a diagnosis prints run as written and lead to the variant for the GPU
the trace was recorded on."""

from __future__ import annotations

import re
import shlex

import tracefiles as T
from click.testing import CliRunner

from advisor.cli import cli


def next_commands(markdown: str) -> list[str]:
    return re.findall(r"^- Next: `(advisor generate [^`]+)`", markdown, flags=re.M)


def trace_on(tmp_path, sms: int, name: str = "NVIDIA H100 PCIe"):
    doc = T.kineto_doc()
    doc["deviceProperties"] = [dict(T.H100_PROPS, name=name, numSms=sms)]
    return T.write_kineto(tmp_path / f"gemm_{sms}.json", doc)


def test_next_commands_carry_the_traces_sm_count(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(cli, ["diagnose", str(trace_on(tmp_path, 114))])
    assert r.exit_code == 0, r.output
    cmds = next_commands(r.output)
    assert {c.split()[2] for c in cmds} == {"stream_k", "warp_specialization"}, cmds
    for cmd in cmds:
        assert "--sm-count 114" in cmd, cmd
        g = runner.invoke(cli, shlex.split(cmd)[1:])
        assert g.exit_code == 0, (cmd, g.output)
        # the model that picked the knobs saw the trace's 114 SMs, not generate's 132 default;
        # each command writes its own file (strategy and shape in the name), none overwrites another
        out = shlex.split(cmd)[-1]
        assert out == f"{cmd.split()[2]}_{cmd.split()[4]}.py"
        assert "'sm_count': 114}" in (tmp_path / out).read_text()
    assert len({shlex.split(c)[-1] for c in cmds}) == len(cmds)


def test_next_commands_on_the_default_gpu_stay_short(tmp_path):
    r = CliRunner().invoke(cli, ["diagnose", str(trace_on(tmp_path, 132, name="NVIDIA H100 80GB HBM3"))])
    cmds = next_commands(r.output)
    assert cmds and not any("--sm-count" in c for c in cmds), cmds


def test_run_without_a_gpu_generates_for_the_traces_sm_count(tmp_path, monkeypatch):
    # `diagnose --run` on a machine without a GPU writes the variants with the model's knobs:
    # for the GPU the trace ran on, as its "Next:" commands do, not for 132 SMs
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["diagnose", str(trace_on(tmp_path, 114)), "--run", "--out", str(out)])
    assert r.exit_code == 0, r.output
    (variant,) = out.glob("variant_*.py")
    assert "'sm_count': 114}" in variant.read_text()


def test_run_without_a_gpu_generates_the_grouped_variant_for_the_traces_sm_count(tmp_path, monkeypatch):
    from conftest import DATA

    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["diagnose", str(DATA / "h200" / "small_gemms.sqlite.gz"), "--sm-count", "100", "--run",
                                 "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert "--sm-count 100 -o grouped.py" in (out / "report.md").read_text()
    (variant,) = out.glob("variant_launch_overhead_*.py")
    assert "'sm_count': 100}" in variant.read_text()


def fp8_trace(tmp_path):
    evs = T.kineto_gemm_events(6)
    for e in evs:
        if e["cat"] == "cpu_op":
            e["args"]["Input type"] = ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn"]
    return T.write_kineto(tmp_path / "fp8.json", T.kineto_doc(evs))


def test_a_gemm_in_a_dtype_advisor_cannot_generate_is_not_passed_off_as_bf16(tmp_path, monkeypatch):
    trace = fp8_trace(tmp_path)
    r = CliRunner().invoke(cli, ["diagnose", str(trace)])
    assert r.exit_code == 0 and "1664x1408x8192 fp8" in r.output
    lines = [x for x in r.output.splitlines() if x.startswith("- Next: `advisor generate")]
    assert lines and all("this fp8 GEMM gets a bf16 variant" in x for x in lines), lines
    # --run would time bf16 candidates against the observed fp8 kernel: it says so and skips
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["diagnose", str(trace), "--run", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "--run: skipped tail_wave: fp8 GEMM (1664x1408x8192)" in r.stderr, r.stderr
    assert not list(out.glob("variant_*.py"))


def test_a_double_gemm_is_known_as_fp64_not_assumed_bf16(tmp_path, monkeypatch):
    # Kineto records torch.float64 operands as "double": the shape's dtype must say fp64 (so
    # --run does not time bf16 candidates against it, and its HBM floor counts 8-byte elements)
    import json as _json


    # 900 us a launch: 38 GFLOP in fp64 cannot run much faster on an H100 (67 TFLOP/s datasheet,
    # derated): at the bf16 twin's 500 us the estimate's physics bound would leave nothing
    evs = T.kineto_gemm_events(6, dur_us=900.0)
    for e in evs:
        if e["cat"] == "cpu_op":
            e["args"]["Input type"] = ["double", "double"]
    trace = T.write_kineto(tmp_path / "f64.json", T.kineto_doc(evs))
    r = CliRunner().invoke(cli, ["diagnose", str(trace), "--json"])
    findings = _json.loads(r.stdout)["findings"]
    shapes = [f["shape"] for f in findings if f["shape"]]
    assert shapes and all(s["dtype"] == "fp64" for s in shapes), shapes
    # fp64 has no wgmma on Hopper: no warp-specialization finding for it (the bf16 twin has one)
    assert "hopper_no_ws" not in {f["symptom"] for f in findings}
    bf16 = T.write_kineto(tmp_path / "bf16.json", T.kineto_doc(T.kineto_gemm_events(6)))
    r16 = CliRunner().invoke(cli, ["diagnose", str(bf16), "--json"])
    assert "hopper_no_ws" in {f["symptom"] for f in _json.loads(r16.stdout)["findings"]}
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    r = CliRunner().invoke(cli, ["diagnose", str(trace), "--run", "--out", str(tmp_path / "run")])
    assert "--run: skipped tail_wave: fp64 GEMM (1664x1408x8192)" in r.stderr, r.stderr


def test_the_hbm_floor_of_an_fp64_gemm_counts_8_byte_elements():
    from advisor.symptoms.context import gemm_bytes

    shape = {"M": 256, "N": 256, "K": 131072, "batch": 1, "dtype": "fp64"}
    assert gemm_bytes(shape) == (8 * (256 * 131072 * 2 + 256 * 256), True)
