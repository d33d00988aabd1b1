"""The default configs compile for the H200 (sm_90a) on this CPU-only machine.

The interpreter runs only the branches a launch takes, so a kernel branch that a config never
executes is never type-checked on the CPU; the GPU compiler checks them all. Until
2026-11-29 stream_k_gemm passed C (bf16) as the placeholder for its int32 counters when no
tile was split, and `matmul(a, b)` failed to compile on the H200 for every shape whose tiles
fill whole waves (default policy "dp": no Stream-K program, so the fixup's branch is only
skipped at run time). 1536x1408 is 132 tiles of 128x128, one full wave on 132 SMs. (One
K-chunk a tile, 116-131 tiles, compiled even then: Triton specializes an argument equal to 1,
so that branch folds away.) Compile-only (tools/sm90_compile_check.py), in a child process
because the tests import the kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("shape, plan", [("1536x1408x4096", "dp aligned")])
def test_stream_k_defaults_compile_for_sm90(shape, plan):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.sm90_compile_check", "stream_k_gemm", "--default-only",
         "--shapes", shape, "--dtypes", "bfloat16"],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{plan} tma" in proc.stdout, proc.stdout  # the plan this shape is here for
    assert "0 failure(s)" in proc.stdout


@pytest.mark.slow
def test_variants_file_compiles_its_configs(tmp_path):
    # --variants compiles exactly a probe's configs (here the 64-row Stream-K pieces the tail
    # search added on 2026-12-01, whose one-chunk branch stores by pointer) on their shapes,
    # and reports a config the schedule refuses as a failure
    spec = {"shapes": ["2304x2304x4096"], "variants": [
        {"schedule": "stream_k_gemm", "config": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4,
                                                 "num_stages": 5, "policy": "hybrid1", "aligned": True,
                                                 "use_tma": True, "SK_SPLIT_M": 2}},
        {"schedule": "dp_gemm", "config": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "num_warps": 8,
                                           "num_stages": 4}, "shapes": ["512x512x512"]}]}
    path = tmp_path / "variants.json"
    path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tools.sm90_compile_check", "--variants", str(path)],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "hybrid1 aligned tma m/2" in proc.stdout and "2304x2304x4096 bfloat16" in proc.stdout
    assert "FAIL dp_gemm 512x512x512 bfloat16" in proc.stdout and "shared memory" in proc.stdout
    assert "1 failure(s)" in proc.stdout
