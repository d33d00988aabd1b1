"""advisor generate split_kv: the --attn parser, validated integers only in the generated file,
its knobs named, its --check under the Triton interpreter, and the CLI's one-line errors."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.symptoms.attention import num_splits_for
from kernels.split_kv_tuning import fill_splits, nearest_point
from advisor.cli import cli
from advisor.errors import AdvisorError
from advisor.codegen.generate import generate_split_kv, parse_attn

HOSTILE = 'k"""\'\n__import__("pathlib").Path("PWNED").touch()  # {{ 7*7 }} {% raw %} `x`'


def _run(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, str(path), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_parse_attn():
    assert parse_attn("1:32:8:128:32768") == {"B": 1, "Hq": 32, "Hkv": 8, "D": 128, "S": 32768, "Lq": 1}
    assert parse_attn(" 2:8:8:64:100:4 ")["Lq"] == 4
    for bad, why in (("1:32:8:128", "expected B:HQ:HKV:D:S"), ("1:30:8:128:100", "multiple of kv heads"),
                     ("1:8:8:8:100", "head_dim 8"), ("1:8:8:64:100:17", "query length 17"),
                     ("1:8:8:64:3:4", "KV length 3 < query length 4"), ("0:8:8:64:100", "B=0"),
                     ("1:8:8:64:1e5", "expected")):
        with pytest.raises(AdvisorError, match=why):
            parse_attn(bad)


def test_generated_source_parses_and_names_its_knobs(tmp_path):
    path = tmp_path / "decode.py"
    v = generate_split_kv(parse_attn("1:32:8:128:32768"), dtype="bf16",
                          finding={"kernel": HOSTILE, "evidence": {"note": HOSTILE}}, path=path)
    src = path.read_text()
    tree = ast.parse(src)
    assert v.attn["S"] == 32768 and v.strategy == "split_kv"
    assert 'SHAPE = {"B": 1, "HQ": 32, "HKV": 8, "D": 128, "S": 32768, "LQ": 1}' in src
    knobs = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "KNOBS")
    named = ast.literal_eval(knobs.value)
    assert set(named) >= {"BLOCK_N", "BLOCK_H", "num_warps", "num_stages", "NUM_SPLITS"}
    # the split count of the measured table's nearest point (8 units at 32k keys: 2 programs an
    # SM on 132 SMs, so 33 splits of the 8 kv-heads), not the wave rule's 32
    point = nearest_point(8, 32768)
    assert named["NUM_SPLITS"] == fill_splits(8, 132, point["programs_per_sm"], 32768) == 33
    # trace text only inside a literal: nothing executes it, the template did not expand it
    assert "PWNED" in src and "{{ 7*7 }}" in src and "49" not in src.split("FINDING =")[1].split("\n")[0]
    assert "from ." not in src and "def decode_attention" in src and "def variant_attention" in src


def test_generated_bench_settles_before_it_times(tmp_path, monkeypatch):
    # the variant is timed first, so its --bench discards graph timings first: at least 3, then
    # until two agree within 2%, at most 5 (two slow ones agreed on the H200: 1083.3, 1082.9)
    import importlib.util

    path = tmp_path / "decode_settle.py"
    generate_split_kv(parse_attn("1:8:2:16:90"), dtype="bf16", path=path)
    spec = importlib.util.spec_from_file_location("decode_settle", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look themselves up there
    spec.loader.exec_module(mod)

    def script(times):
        it = iter(times)
        return lambda: next(it)

    assert mod._settle(script([1083.3, 1082.9, 948.9, 949.2, 0.0])) == [1083.3, 1082.9, 948.9, 949.2]
    assert mod._settle(script([15.8, 15.6, 15.6, 0.0])) == [15.8, 15.6, 15.6]
    assert mod._settle(script([5.0, 6.0, 7.0, 8.0, 9.0, 0.0])) == [5.0, 6.0, 7.0, 8.0, 9.0]
    src = path.read_text()
    assert src.index("settled = _settle(") < src.index("for name, fn in providers.items():")


@pytest.mark.parametrize("mode", ["graph", "eager", "refused"])
def test_generated_bench_order_and_fallbacks(tmp_path, monkeypatch, mode):
    # run_bench on the CPU with the GPU calls faked: the variant is settled and timed first,
    # timed again (with the timer it got) just before the math backend, which goes last; a
    # variant that cannot be captured in a graph is timed eagerly both times; a refused one
    # is recorded, never raised
    import importlib.util
    import types

    import torch

    path = tmp_path / f"decode_{mode}.py"
    generate_split_kv(parse_attn("1:8:2:16:90"), dtype="bf16", path=path)
    spec = importlib.util.spec_from_file_location(f"decode_{mode}", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(L2_cache_size=60 << 20))
    calls, who = [], {"now": None}

    def variant_attention(q, k, v, out=None):
        who["now"] = "variant"
        if mode == "refused":
            raise ValueError("refused for the test")
        return q

    def sdpa(backend):
        def call(q, k, v, mask):
            who["now"] = str(backend).rsplit(".", 1)[-1]
            return q
        return call

    def timer(kind, us):
        def time_it(fn, sets, reps=20):
            fn(0)
            calls.append((kind, who["now"]))
            if kind == "graph" and who["now"] == "variant" and mode == "eager":
                raise RuntimeError("operation not permitted when stream is capturing")
            return us
        return time_it

    monkeypatch.setattr(mod, "variant_attention", variant_attention)
    monkeypatch.setattr(mod, "_sdpa", sdpa)
    monkeypatch.setattr(mod, "_causal_mask", lambda lq, s, dev: None)
    monkeypatch.setattr(mod, "random_inputs", lambda B, HQ, HKV, LQ, S, D, dt, dev, seed=0: (
        torch.randn(B, HQ, LQ, D), torch.randn(B, HKV, S, D), torch.randn(B, HKV, S, D)))
    monkeypatch.setattr(mod, "_time_graph", timer("graph", 100.0))
    monkeypatch.setattr(mod, "_time_eager", timer("eager", 200.0))
    res = mod.run_bench(dict(mod.SHAPE), mod.DTYPE)
    var = res["variant"]
    order = [w for _, w in calls]
    assert order[-1] == "MATH" and order.index("MATH") > max(i for i, w in enumerate(order) if w != "MATH")
    if mode == "refused":
        assert "refused" in var and "variant" not in order
        return
    assert var["median_us"] == (100.0 if mode == "graph" else 200.0) and var["repeat_us"] == var["median_us"]
    assert var["timer"] == mode and var["speedup_vs_best_sdpa"] == pytest.approx(100.0 / var["median_us"])
    assert order[-2] == "variant" and order.index("FLASH_ATTENTION") < len(order) - 2
    assert len(var["settle_us"]) == (3 if mode == "graph" else 0)  # the graph settle fails when it cannot capture


@pytest.mark.interpreter
def test_generated_check_runs_under_the_interpreter(tmp_path):
    # GQA 4, three causal query positions, bf16, a ragged last chunk; then a bad --attn
    path = tmp_path / "decode.py"
    generate_split_kv(parse_attn("1:8:2:16:90:3"), dtype="bf16", knobs={"BLOCK_N": 16, "NUM_SPLITS": 3}, path=path)
    r = _run(path, "--check", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["check"]["ok"] and res["check"]["rel_err"] < res["check"]["tolerance"]
    assert res["shape"] == {"B": 1, "HQ": 8, "HKV": 2, "D": 16, "S": 90, "LQ": 3}
    assert not (tmp_path / "PWNED").exists()
    r = _run(path, "--check", "--attn", "1:4:1", cwd=tmp_path)
    assert r.returncode == 2 and "--attn must look like" in r.stderr


def test_generate_split_kv_cli(tmp_path):
    out = tmp_path / "d.py"
    r = CliRunner().invoke(cli, ["generate", "split_kv", "--attn", "4:32:8:128:65536", "--config", "num_stages=2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "split_kv, B=4 Hq=32 Hkv=8 D=128 S=65536" in r.output and "NUM_SPLITS=" in r.output
    assert "set by --config: num_stages" in r.output
    ast.parse(out.read_text())
    for args, why in ((["--shape", "64x64x64"], "needs --attn"),
                      (["--attn", "1:32:8:128:100", "--shape", "1x1x1"], "not --shape"),
                      (["--attn", "1:32:7:128:100"], "multiple of kv heads")):
        r = CliRunner().invoke(cli, ["generate", "split_kv", *args, "-o", str(tmp_path / "x.py")])
        assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = CliRunner().invoke(cli, ["generate", "dp", "--attn", "1:32:8:128:100", "-o", str(tmp_path / "x.py")])
    assert r.exit_code == 2 and "--attn is for the split_kv strategy" in r.output

    # --config stream=true alone gives the stream schedule's grid (no split count, last arriver);
    # a split count asked for with it is refused in one line
    r = CliRunner().invoke(cli, ["generate", "split_kv", "--attn", "1:32:8:128:8192", "--config", "stream=true",
                                 "--config", "CTAS_PER_SM=3", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "NUM_SPLITS=0" in r.output and "stream=True" in r.output and "CTAS_PER_SM=3" in r.output
    assert "combine=last_arriver" in r.output
    r = CliRunner().invoke(cli, ["generate", "split_kv", "--attn", "1:32:8:128:8192", "--config", "stream=true",
                                 "--config", "NUM_SPLITS=4", "-o", str(out)])
    assert r.exit_code == 2 and "NUM_SPLITS must be 0" in r.output, r.output
    # and back: a split knob on a stream default (batch 4 at 128k keys) gives the split
    # schedule at the same programs per SM (32 units: ceil(per SM x 132 / 32) splits, 9 at 2
    # an SM), never an error
    point = nearest_point(32, 131072)
    assert point["stream"], point
    fill = f"NUM_SPLITS={-(-point['programs_per_sm'] * 132 // 32)}"
    for extra, want in ((["NUM_SPLITS=8"], "NUM_SPLITS=8"), (["combine=kernel"], fill), (["stream=false"], fill)):
        args = [a for e in extra for a in ("--config", e)]
        r = CliRunner().invoke(cli, ["generate", "split_kv", "--attn", "4:32:8:128:131072", *args, "-o", str(out)])
        assert r.exit_code == 0 and want in r.output and "stream=False" in r.output, (extra, r.output)


def test_knob_split_rule_matches_the_kernel():
    # advisor.symptoms.attention and the kernel file each carry the rule (a kernel file stands alone)
    kv = pytest.importorskip("advisor.codegen.kernel_lib").load("split_kv_attention")
    for units in (1, 2, 3, 8, 16, 24, 40, 64, 100, 200, 260):
        for slots in (6, 132, 264, 528):
            for blocks in (1, 4, 32, 100, 512):
                assert num_splits_for(units, slots, blocks) == kv.num_splits_for(units, slots, blocks)
