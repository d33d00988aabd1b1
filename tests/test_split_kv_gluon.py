"""kernels/split_kv_gluon.py on a machine without Triton 3.9 or a GPU: its split plan, why it
does not run here, that split_kv_attention's default call hands over to it only where it runs
(and an explicit config never does), and, where Triton 3.9 is unpacked at /tmp/triton39, the
sm_90a build of its kernels for the shapes it takes. Its numbers are checked on the GPU by
bench/probe_gluon_decode.py (docs/split_kv.md, "Sixth round")."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from advisor.codegen.kernel_lib import load

g = load("split_kv_gluon")
kv = load("split_kv_attention")
ROOT = Path(__file__).resolve().parents[1]
TRITON39 = Path("/tmp/triton39")


@pytest.mark.parametrize("B, Hkv, S", [(1, 8, 8192), (2, 8, 8192), (2, 8, 32768), (4, 8, 8192), (8, 8, 131072),
                                       (3, 8, 20000), (64, 8, 4096), (1, 1, 65), (1, 8, 64), (5, 3, 100001)])
def test_plan_is_one_wave_of_whole_tile_shares(B, Hkv, S):
    sms = 132
    splits, per, stages = g.plan(B, Hkv, S, sms)
    tiles = math.ceil(S / g.BLOCK_N)
    # every tile in exactly one split, none empty
    assert (splits - 1) * per < tiles <= splits * per
    programs = splits * B * Hkv
    per_sm = 2 if stages == 3 else 1
    assert stages in (3, 4)
    # one wave where the units allow it (a unit is at least one program)
    assert programs <= max(per_sm * sms, B * Hkv)
    if stages == 3:
        assert per >= 16  # two programs an SM only where each still walks a long chunk


def test_short_context_takes_one_program_an_sm_and_long_two():
    # measured on the H200 (docs/split_kv.md): batch 1-2 at 8k keys chunk too finely at two programs an SM
    assert g.plan(1, 8, 8192, 132)[2] == 4 and g.plan(2, 8, 8192, 132)[2] == 4
    assert g.plan(4, 8, 8192, 132)[2] == 3 and g.plan(2, 8, 32768, 132)[2] == 3
    # equal shares: 8 units at two programs an SM take 33 splits, not a ragged 34th
    splits, per, _ = g.plan(2, 8, 131072, 132)
    assert splits == 16 and per == 128


class _Desc:
    def __init__(self, base):
        self.base = base


def test_profiles_name_the_kernel_as_advisors_split_kv():
    from advisor.symptoms.attention import attention_backend

    k = torch.empty((2, 8, 40000, 128), dtype=torch.bfloat16)
    meta = g._metadata(None, None, {"k_desc": _Desc(k), "S": 32768, "n_splits": 16})
    assert meta["bytes"] == 2 * 2 * 8 * 32768 * 128 * 2 and "S=32768" in meta["name"]
    # the diagnosis reads both kernels as advisor's own split schedule, the second as its combine
    assert attention_backend("split_kv_kernel_ring")[0] == "advisor"
    assert attention_backend("split_kv_combine_kernel_ring")[1:] == (True, True)


def test_a_failed_gluon_call_hands_back_to_triton_once(monkeypatch):
    monkeypatch.setattr(g, "supports", lambda q, k, v: None)
    monkeypatch.setattr(g, "_FAILED", [])

    def broken(*a, **kw):
        raise RuntimeError("ptxas failed")

    monkeypatch.setattr(g, "decode_attention", broken)
    q = torch.randn(1, 8, 1, 64)
    with pytest.warns(RuntimeWarning, match="runs the Triton kernel"):
        assert g.try_decode(q, q, q, 0.1, q) is None
    assert g.try_decode(q, q, q, 0.1, q) is None and len(g._FAILED) == 1  # no second try, no second warning


def test_why_it_does_not_run_here():
    q = torch.randn(1, 8, 1, 64)
    k = torch.randn(1, 2, 100, 64)
    why = g.supports(q, k, k)
    assert why and "\n" not in why
    with pytest.raises(RuntimeError, match="split_kv_gluon"):
        g.decode_attention(q, k, k)


def test_default_call_hands_over_only_without_a_config(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []

    def fast(q, k, v, scale, out):
        calls.append(scale)
        return torch.full_like(q, 7.0)

    monkeypatch.setattr(kv, "_written_pipeline", fast)
    q, k, v = kv.random_inputs(1, 4, 2, 1, 80, 32, torch.float32, "cpu")
    assert bool((kv.decode_attention(q, k, v, scale=0.5) == 7.0).all()) and calls == [0.5]
    with pytest.raises(ValueError, match="finite"):  # validation still comes first
        kv.decode_attention(q, k, v, scale=float("inf"))
    # an explicit config is the Triton kernel's, whatever Gluon could run
    cfg = kv.Config(BLOCK_N=16, num_stages=2, NUM_SPLITS=2, MIN_CHUNK=16)
    got = kv.decode_attention(q, k, v, cfg)
    assert calls == [0.5]
    assert kv.rel_error(got, kv.reference(q, k, v)) <= kv.TOLERANCE[torch.float32]


def test_no_hand_over_on_the_cpu_or_in_a_generated_variant(monkeypatch):
    q = torch.randn(1, 8, 1, 64)
    k = torch.randn(1, 2, 100, 64)
    assert kv._written_pipeline(q, k, k, 0.1, None) is None  # CPU tensors: the interpreter's path
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    # a generated variant: a bare file (no package), or a file in someone's package, which has
    # no split_kv_gluon beside it
    for package in ("", "someones_package"):
        monkeypatch.setattr(kv, "__package__", package)
        assert kv._written_pipeline(q, k, k, 0.1, None) is None


@pytest.mark.slow
@pytest.mark.skipif(not (TRITON39 / "triton").is_dir(), reason="Triton 3.9 not unpacked at /tmp/triton39")
def test_sm90_build_under_triton_39():
    env = dict(os.environ, PYTHONPATH=f"{TRITON39}:{ROOT}", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-m", "kernels.gluon_compile_check", "--split-kv"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    built = [ln for ln in r.stdout.splitlines() if ln.startswith("ok") and "split_kv_kernel_ring" in ln]
    # 5 cases x 2 ring depths x 2 combines (a second kernel; the last arriver's in-kernel one)
    assert len(built) == 20 and all("wgmma" in ln and "tma_load" in ln and "stack=0" in ln for ln in built)
    assert sum("last_arriver" in ln for ln in built) == 10


@pytest.mark.parametrize("R, tile", [(1, (1, 64)), (4, (4, 16)), (5, (8, 8)), (32, (32, 2)), (64, (64, 1))])
def test_last_arrivers_combine_tile_holds_every_row_and_64_row_splits(R, tile):
    # all R rows of a unit at once (a power of two), splits filling the rest of 64 (registers)
    assert g.combine_tile(R) == tile


def test_an_unknown_combine_is_refused_before_anything_runs():
    q = torch.randn(1, 8, 1, 64)
    with pytest.raises(ValueError, match="combine must be one of"):
        g.decode_attention(q, q, q, combine="atomic")
    assert g.COMBINE in g.COMBINES
