"""cluster_gemm (kernels/gluon_gemm.py): selection and fallback, config space, generated source,
and (where Triton 3.9 is unpacked at /tmp/triton39) the sm_90a compile check in a subprocess."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.codegen.generate import generate
from advisor.codegen.kernel_lib import load
from advisor.run.loop import cluster_gemm_gate, with_cluster_gemm

ROOT = Path(__file__).resolve().parents[1]
TRITON39 = Path("/tmp/triton39")
HOPPER_39 = ((3, 9), "9.0")


def test_gate_reasons():
    assert cluster_gemm_gate("bf16", (3, 9), "9.0") is None
    assert cluster_gemm_gate("fp16", (3, 10), "9.0") is None
    assert "Triton 3.6" in cluster_gemm_gate("bf16", (3, 6), "9.0")
    assert "no CUDA GPU" in cluster_gemm_gate("bf16", (3, 9), None)
    assert "sm_100" in cluster_gemm_gate("bf16", (3, 9), "10.0")
    assert "fp32" in cluster_gemm_gate("fp32", (3, 9), "9.0")
    assert "not installed" in cluster_gemm_gate("bf16", None, "9.0")


def test_joins_where_prescribed_and_allowed():
    out, why = with_cluster_gemm(["stream_k", "persistent"], "bf16", HOPPER_39)
    assert out == ["stream_k", "persistent", "cluster_gemm"] and why is None
    out, why = with_cluster_gemm(["warp_specialization"], "bf16", HOPPER_39)
    assert out[-1] == "cluster_gemm"
    # split-K territory: not prescribed, no note
    assert with_cluster_gemm(["split_k"], "bf16", HOPPER_39) == (["split_k"], None)


def test_falls_back_with_one_line_reason_under_triton_36():
    out, why = with_cluster_gemm(["stream_k", "persistent"], "bf16", ((3, 6), "9.0"))
    assert out == ["stream_k", "persistent"]
    assert "Triton >= 3.9" in why and "\n" not in why


def test_this_environment_falls_back_and_the_module_imports():
    mod = load("cluster_gemm")  # Triton 3.6 here: must import, never ImportError
    why = mod.unavailable_reason()
    if mod.triton_version() is not None and mod.triton_version() < (3, 9):
        assert why and "3.9" in why
        out, note = with_cluster_gemm(["stream_k"], "bf16")
        assert out == ["stream_k"] and note
        import torch

        with pytest.raises(RuntimeError, match="3.9"):
            mod.matmul(torch.zeros(8, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))


def test_config_space():
    mod = load("cluster_gemm")
    space = mod.search_space(4096, 4096, 8192)
    tiles = {(c.BLOCK_M, c.BLOCK_N) for c in space}
    assert tiles == {(128, 128), (128, 256), (256, 128)}
    steps = {(c.ws, c.cluster, c.multicast) for c in space}
    assert steps == {(False, 1, False), (True, 1, False), (True, 2, False), (True, 2, True)}
    for c in space:
        c.validate()  # fits 227 KB
        assert c.smem_bytes() <= mod.SMEM_PER_BLOCK_SM90
    # no pairing of M tiles when there is one tile row
    assert all(c.cluster == 1 for c in mod.search_space(64, 4096, 14336))
    d = mod.default_config(4096, 4096, 8192)
    assert (d.ws, d.cluster, d.multicast) == (True, 2, True)
    with pytest.raises(ValueError, match="multicast"):
        mod.Config(cluster=1, multicast=True)
    with pytest.raises(ValueError, match="ws=True"):
        mod.Config(ws=False, cluster=2, multicast=True)
    with pytest.raises(ValueError, match="shared memory"):
        mod.Config(128, 256, 64, 6).validate()


def test_generated_source_parses_and_names_knobs(tmp_path):
    v = generate("cluster_gemm", 2304, 2304, 4096, path=tmp_path / "v.py")
    tree = ast.parse(v.source)
    assert "STRATEGY = 'cluster_gemm'" in v.source or 'STRATEGY = "cluster_gemm"' in v.source
    for knob in ("BLOCK_M", "BLOCK_N", "STAGES", "ws", "cluster", "multicast"):
        assert f"'{knob}'" in v.source or f'"{knob}"' in v.source
        assert knob in v.knobs
    assert any(isinstance(n, ast.FunctionDef) and n.name == "variant_matmul" for n in tree.body)
    assert "multicast=MULTICAST" in v.source  # the Gluon kernel travels with the file
    # the model cannot price clusters: the full design is what it picks among equal tiles
    assert v.knobs["ws"] and v.knobs["cluster"] == 2 and v.knobs["multicast"]
    v2 = generate("cluster_gemm", 2304, 2304, 4096, knobs={"cluster": 1, "multicast": False})
    assert v2.knobs["cluster"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not (TRITON39 / "triton").is_dir(), reason="Triton 3.9 not unpacked at /tmp/triton39")
def test_sm90_compile_check_under_triton_39():
    env = dict(os.environ, PYTHONPATH=f"{TRITON39}:{ROOT}", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "kernels.gluon_compile_check", "--shapes", "1000x1304x776"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ok")]
    assert len(lines) == 12
    mc = [ln for ln in lines if "c2+mc" in ln]
    assert mc and all("multicast" in ln and "wgmma" in ln and "cluster" in ln for ln in mc)
    assert all("stack=0" in ln for ln in lines)
