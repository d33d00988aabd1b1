"""The advice uses the cluster GEMM's measurements (issue 38 part 3): its calibration entries,
the shape class a trace's GEMM maps onto, and hopper_no_ws on a library kernel raised only
where the cluster GEMM measurably beat cuBLAS on that class. Each check failed before."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from synthetic import H100, kernel, launch, make_trace, nvtx

from advisor.diagnose.diagnosis import diagnose
from advisor.rules import load_rules
from advisor.symptoms.calibration import ShapeClasses, measured_for, reached, shape_class

ROOT = Path(__file__).resolve().parents[1]
H200_DEV = {**H100, "name": "NVIDIA H200", "mem_bandwidth_bytes_per_s": 4.8e12}
RULE = load_rules()["hopper_no_ws"]
CLASSES = ShapeClasses(RULE["cluster_balanced_tail_efficiency"], RULE["cluster_max_shape_factor"])
# a non-warp-specialized Hopper cuBLAS kernel (one warpgroup a CTA, 256 threads: no producer)
LIB = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


def _cluster_rows():
    return [r for r in measured_for({"name": "NVIDIA H200"}).schedules if r["strategy"] == "cluster_gemm"]


def _diag(M, N, K, dur_ns, name=LIB, n=20):
    step = dur_ns + 50_000
    grid = (-(-M // 128) * -(-N // 128), 1, 1)
    ks = [kernel(i * step, dur_ns, name=name, grid=grid, block=(256, 1, 1), corr=i) for i in range(n)]
    ranges = [nvtx(f"gemm M={M} N={N} K={K} bf16", i * step - 5000, i * step + 1000) for i in range(n)]
    rt = [launch(i, i * step - 3000) for i in range(n)]
    return diagnose(make_trace(ks, devices=(H200_DEV,), ranges=ranges, runtime=rt))


def _hopper(d):
    return [f for f in d.findings if f.symptom == "hopper_no_ws"]


def _notes(d):
    return [n for n in d.notes if n.startswith("hopper_no_ws")]


# ------------------------------------------------------------------ calibration entries


def test_cluster_entries_parse_beside_the_other_schedules():
    rows = _cluster_rows()
    # 13 shapes of the suites, each over cuBLAS, median of the three rounds (round 3 in two files:
    # one run of the skinny suite, one of the tail and balanced ones)
    assert len(rows) == 13
    assert {r["suite"] for r in rows} == {"tail", "balanced", "skinny"}
    for r in rows:
        assert r["versus"] == "cublas" and r["dtype"] == "bf16" and r["triton"] == "3.9.0"
        assert r["runs"] == 3 and 0 < r["ratio"] <= r["best"]
    by = {r["shape"]: r for r in rows}
    assert 1.05 < by["8192x8192x8192"]["ratio"] < by["8192x8192x8192"]["best"] == 1.082
    assert by["1664x1408x8192"]["ratio"] < 0.8  # where it lost


def test_toml_is_what_make_calibration_writes(tmp_path):
    """The committed file is the script's output over the committed rows (no hand edits)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_calibration", ROOT / "bench" / "make_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "h200.toml"
    rounds = ["bench/results/cluster_gemm/cluster_gemm.csv", "bench/results/cluster_gemm/round2/cluster_gemm.csv",
              "bench/results/cluster_gemm/round3/skinny/cluster_gemm.csv",
              "bench/results/cluster_gemm/round3/tail_balanced/cluster_gemm.csv"]
    mod.main([str(ROOT / "bench/results/h200.csv.gz"), str(out), "--cluster-rows", *[str(ROOT / p) for p in rounds],
              "--attention-rows", str(ROOT / "bench/results/attention_fusion/attention_fusion.csv"),
              "--attention-bias-rows", str(ROOT / "bench/results/attention_bias/attention_bias.csv"),
              "--conv-rows", str(ROOT / "bench/results/grouped_conv/grouped_conv.csv")])
    mine = tomllib.loads(out.read_text(encoding="utf-8"))
    committed = tomllib.loads((ROOT / "rules/measured/h200.toml").read_text(encoding="utf-8"))
    assert mine == committed


def test_measured_shapes_fall_in_the_class_of_their_suite():
    """The one definition of a shape class puts every measured shape in the suite it was
    measured as, on the 132 SMs it was measured on."""
    rows = _cluster_rows()
    assert rows
    for r in rows:
        M, N, K = (int(x) for x in r["shape"].split("x"))
        assert shape_class({"M": M, "N": N, "K": K}, 132, CLASSES.balanced_tail_efficiency) == r["suite"], r["shape"]


def test_reached_maps_a_shape_onto_its_class_and_no_further():
    h200 = {"name": "NVIDIA H200", "sm_count": 132}
    exact = reached("cluster_gemm", {"M": 8192, "N": 8192, "K": 8192, "dtype": "bf16"}, LIB, h200, CLASSES)
    assert exact.exact and exact.shape_class == "balanced" and exact.ratio == pytest.approx(1.065)
    # unmeasured balanced shape: the worst measured balanced shape near it
    near = reached("cluster_gemm", {"M": 6144, "N": 6144, "K": 8192, "dtype": "bf16"}, LIB, h200, CLASSES)
    assert not near.exact and near.shape_class == "balanced" and near.ratio == pytest.approx(1.023)
    # 4x past every measured shape: no number at all rather than an extrapolation
    assert reached("cluster_gemm", {"M": 32768, "N": 32768, "K": 32768, "dtype": "bf16"}, LIB, h200, CLASSES) is None
    # without class thresholds only measured shapes speak; fp32 is not a dtype it runs
    assert reached("cluster_gemm", {"M": 6144, "N": 6144, "K": 8192, "dtype": "bf16"}, LIB, h200) is None
    assert reached("cluster_gemm", {"M": 8192, "N": 8192, "K": 8192, "dtype": "fp32"}, LIB, h200, CLASSES) is None


# ------------------------------------------------------------------ hopper_no_ws on a library kernel


@pytest.mark.parametrize("shape,dur_ns,exact", [((8192, 8192, 8192), 1_700_000, True)])
def test_cublas_on_a_balanced_shape_gets_the_cluster_finding(shape, dur_ns, exact):
    """cuBLAS at ~80% of the measured peak: before, a "near peak" note; the cluster GEMM
    measured 1.065x cuBLAS on 8192^3 (median of three runs), so it is a finding whose estimate
    is time x (1 - 1/ratio), here under the roofline cap. (An unmeasured balanced shape reads
    the worst near it, 4096^2 x 8192 at 1.02x: under the margin, a note; below.)"""
    d = _diag(*shape, dur_ns)
    (f,) = _hopper(d)
    assert f.strategy == "cluster_gemm" and f.evidence["shape_class"] == "balanced"
    ratio = f.evidence["measured_ratio"]
    assert ratio > 1 + RULE["cluster_margin"]
    assert f.est_savings_ns == pytest.approx(f.total_ns * (1 - 1 / ratio), abs=1)
    assert f.evidence["capped_by"] == "measured" and f.est_savings_ns <= f.total_ns - f.evidence["bound_ns"]
    assert "cluster_gemm" in f.evidence["basis"] and f.evidence["measured_exact"] is exact
    assert f.confidence == ("medium" if exact else "low")
    assert "Triton >= 3.9" in f.watch_for and "advisor generate cluster_gemm" in f.evidence["library_change"]
    assert not _notes(d)


def test_the_roofline_still_caps_the_cluster_estimate():
    """A cuBLAS 8192^3 at 95.5% of the measured peak: 1.064x would claim 6% of its time, the
    floor at the measured peak leaves 4.5%: the roofline is the cap."""
    dur = int(2 * 8192**3 / (0.955 * 795.9e12) * 1e9)
    (f,) = _hopper(_diag(8192, 8192, 8192, dur))
    assert f.evidence["capped_by"] == "physics"
    assert f.est_savings_ns < f.total_ns * (1 - 1 / f.evidence["measured_ratio"])
    assert f.est_savings_ns == pytest.approx(f.total_ns - f.evidence["bound_ns"], abs=20)


@pytest.mark.parametrize("shape,dur_ns,said", [
    ((2176, 2176, 8192), 110_000, "0.82x cuBLAS on 2176x2176x8192"),  # measured there, lost
    ((6144, 6144, 8192), 1_000_000, "1.02x cuBLAS on the balanced shapes we measured near"),  # won, under the margin
    ((1792, 1536, 8192), 80_000, "on the tail shapes we measured near 1792x1536x8192"),  # its class lost
    ((32768, 32768, 32768), 95_000_000, "not measured near 32768x32768x32768"),  # too far out
])
def test_cublas_where_the_cluster_gemm_lost_keeps_the_note(shape, dur_ns, said):
    d = _diag(*shape, dur_ns, n=10)
    assert not _hopper(d)
    (note,) = _notes(d)
    assert "no schedule of ours beats the library" in note and said in note, note


def test_a_triton_kernel_keeps_the_ws_advice():
    """Not a library kernel: the warp-specialization finding of before (the 10% prior capped by
    what our WS schedule reached over our data-parallel kernel), no cluster_gemm."""
    d = _diag(8192, 8192, 8192, 1_700_000, name="matmul_kernel")
    (f,) = _hopper(d)
    assert f.strategy == "warp_specialization" and "shape_class" not in f.evidence
    assert f.evidence["basis"].startswith("prior: WS gains 10%")
    assert "our warp_specialization reached" in f.evidence["basis"]
    assert 0 < f.est_savings_ns <= 0.1 * f.total_ns
