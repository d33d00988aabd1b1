"""experiments/probe_configs.py: its variants files (experiments/probes/*.json) must keep loading as the
schedules' Config classes change, and a bad file must fail before any GPU work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
load_variants = load_script("experiments/probe_configs.py").load_variants

PROBES = sorted((ROOT / "experiments" / "probes").glob("*.json"))


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_committed_variant_files_load(path):
    shapes, variants, dtype = load_variants(path)
    assert shapes and variants and dtype in ("bf16", "fp16", "fp32")
    assert "question" in json.loads(path.read_text())
    for v in variants:
        # a variant limited to shapes names only shapes the file runs
        assert v["shapes"] <= set(shapes)


def test_probes_exist():
    assert len(PROBES) >= 4


def write(tmp_path, spec) -> Path:
    p = tmp_path / "v.json"
    p.write_text(json.dumps(spec))
    return p


def test_misspelled_knob_fails_before_gpu_work(tmp_path):
    p = write(tmp_path, {"shapes": ["64x64x64"], "variants": [
        {"schedule": "split_k_gemm", "config": {"BLOCK_M": 16, "SPLITK": 2}}]})
    with pytest.raises(ValueError, match="split_k_gemm"):
        load_variants(p)


def test_invalid_knob_value_fails(tmp_path):
    p = write(tmp_path, {"variants": [{"schedule": "stream_k_gemm", "config": {"policy": "hybrid9"}}]})
    with pytest.raises(ValueError, match="policy"):
        load_variants(p)


def test_missing_fields_and_empty(tmp_path):
    with pytest.raises(ValueError, match="schedule"):
        load_variants(write(tmp_path, {"variants": [{"config": {}}]}))
    with pytest.raises(ValueError, match="no variants"):
        load_variants(write(tmp_path, {"shapes": ["8x8x8"], "variants": []}))


def test_dtype_is_read_and_checked(tmp_path):
    spec = {"shapes": ["8x8x8"], "dtype": "fp32", "variants": [{"schedule": "dp_gemm", "config": {}}]}
    assert load_variants(write(tmp_path, spec))[2] == "fp32"
    with pytest.raises(ValueError, match="float32"):
        load_variants(write(tmp_path, dict(spec, dtype="float32")))


def test_provider_names_and_shape_filters(tmp_path):
    p = write(tmp_path, {"shapes": ["64x64x64", "32x32x32"], "variants": [
        {"schedule": "dp_gemm", "config": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}},
        {"schedule": "split_k_gemm", "config": {"SPLIT_K": 2}, "shapes": ["32x32x32"]}]})
    shapes, variants, dtype = load_variants(p)
    assert shapes == ["64x64x64", "32x32x32"] and dtype == "bf16"
    assert [v["provider"] for v in variants] == ["dp", "split_k"]
    assert variants[0]["shapes"] == set() and variants[1]["shapes"] == {"32x32x32"}


def test_precompile_jobs_follow_the_variants_shapes():
    # experiments/precompile.py warms exactly the (schedule, config, shape) calls the probe will
    # make: a variant's own shapes, else the file's, narrowed by --shapes; --phases only the
    # Stream-K ones (the phase probe runs nothing else)
    jobs_of = load_script("experiments/precompile.py").jobs_of

    spec = {"shapes": ["64x64x64", "32x32x32"], "variants": [
        {"schedule": "stream_k_gemm", "config": {"policy": "sk"}},
        {"schedule": "split_k_gemm", "config": {"SPLIT_K": 2}, "shapes": ["32x32x32"]}]}
    assert jobs_of(spec, None, False) == [
        ("stream_k_gemm", {"policy": "sk"}, "64x64x64"), ("stream_k_gemm", {"policy": "sk"}, "32x32x32"),
        ("split_k_gemm", {"SPLIT_K": 2}, "32x32x32")]
    assert jobs_of(spec, ["32x32x32"], True) == [("stream_k_gemm", {"policy": "sk"}, "32x32x32")]
    # 6 variants on the 5 tail shapes, 2 on 1664x1408x8192 only
    assert len(jobs_of(json.loads((ROOT / "experiments/probes/tail_tma_hand_in.json").read_text()), None, False)) == 32


def test_probe_clocks_reads_nvidia_smi_samples():
    # experiments/probe_clocks.py: nvidia-smi's CSV lines (timestamp, SM MHz, W, C, reasons bitmask);
    # the header-less lines it prints, with an unparsable one skipped
    parse_samples = load_script("experiments/probe_clocks.py").parse_samples

    text = ("2026/12/01 09:10:11.123, 1980, 650.12, 55, 0x0000000000000004\n"
            "[N/A]\n2026/12/01 09:10:11.223, 1582, 691.00, 58, 0x0000000000000000\n")
    samples = parse_samples(text)
    assert [s[1:] for s in samples] == [(1980.0, 650.12, 55.0, "0x0000000000000004"),
                                        (1582.0, 691.0, 58.0, "0x0000000000000000")]
    assert abs((samples[1][0] - samples[0][0]) - 0.1) < 1e-6
