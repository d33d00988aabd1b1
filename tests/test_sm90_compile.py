"""The default configs compile for the H200 (sm_90a) on this CPU-only machine.

The interpreter runs only the branches a launch takes, so a kernel branch that a config never
executes is never type-checked on the CPU; the GPU compiler checks them all. Until
2026-11-29 stream_k_gemm passed C (bf16) as the placeholder for its int32 counters when no
tile was split, and `matmul(a, b)` failed to compile on the H200 for every shape whose tiles
fill whole waves (default policy "dp": no Stream-K program, so the fixup's branch is only
skipped at run time). 1536x1408 is 132 tiles of 128x128, one full wave on 132 SMs. (One
K-chunk a tile, 116-131 tiles, compiled even then: Triton specializes an argument equal to 1,
so that branch folds away.) Compile-only (kernels/sm90_compile_check.py), in a child process
because the tests import the kernels under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("shape, plan", [("1536x1408x4096", "dp aligned")])
def test_stream_k_defaults_compile_for_sm90(shape, plan):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernels.sm90_compile_check", "stream_k_gemm", "--default-only",
         "--shapes", shape, "--dtypes", "bfloat16"],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{plan} tma" in proc.stdout, proc.stdout  # the plan this shape is here for
    assert "0 failure(s)" in proc.stdout
