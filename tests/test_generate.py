"""Variant generation: the file parses, bundles its kernel, runs --check under the Triton
interpreter, keeps trace text inside string literals, and the model's choices are sane."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.codegen.bundle import bundle, coerce_knobs, config_fields, dependency_order
from advisor.errors import AdvisorError
from advisor.codegen.generate import (
    comm_shape_warnings,
    generate,
    generate_comm_overlap,
    generate_grouped,
    group_sizes,
    parse_group,
    parse_shape,
    parse_shapes,
)
from advisor.codegen.schedule_model import (
    Device,
    predict,
    rank,
    stream_k_policies,
    suggest_split_k,
)

HOSTILE = 'k"""\'\n__import__("pathlib").Path("PWNED").touch()  # {{ 7*7 }} {% raw %} `x` <script>'


def _run(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, str(path), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_parse_shape():
    assert parse_shape("256x128x131072") == (256, 128, 131072)
    for bad in ("256x128", "0x1x1", "ax1x1", "1x1x99999999999"):
        with pytest.raises(AdvisorError):
            parse_shape(bad)


def test_bundle_renames_colliding_names():
    order = dependency_order("dp")
    assert order == ["common", "dp_configs", "runtime", "tf32_layout", "gemm_call", "dp_gemm"]
    src, renamed = bundle("dp")
    ast.parse(src)
    assert "from ." not in src and "__future__" not in src
    # A schedule bundled with the dp baseline keeps both `matmul`s apart.
    src2, renamed2 = bundle("dp", extra=("dp",))
    assert renamed2 == renamed


def _nested_quote_fstrings(tree: ast.AST) -> list[int]:
    """Lines of f-strings with a string literal (or another f-string) inside a replacement
    field: ast.unparse on Python 3.12+ writes those with the outer quotes reused, which
    Python 3.11 cannot parse."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            for v in node.values:
                if isinstance(v, ast.FormattedValue) and any(
                        isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str))
                        for n in ast.walk(v.value)):
                    lines.append(node.lineno)
                    break
    return lines


def test_inlined_dependencies_stay_parseable_on_python_3_11():
    # generate() keeps the schedule's own module verbatim but re-emits its kernels/
    # dependencies with ast.unparse; a variant generated on 3.12 must still run on 3.11
    from advisor.codegen.kernel_lib import SCHEDULES, source_path

    deps = {m for name in [*SCHEDULES, "comm_overlap"] for m in dependency_order(name, extra=("dp",))[:-1]}
    assert {"common", "dp_gemm", "persistent_gemm"} <= deps
    for mod in sorted(deps):
        tree = ast.parse(source_path(mod).read_text(encoding="utf-8"))
        assert not _nested_quote_fstrings(tree), f"kernels/{mod}.py: f-strings with quotes inside at lines {_nested_quote_fstrings(tree)}"
    assert _nested_quote_fstrings(ast.parse("x = f\"{'a' if y else ''}\"")) == [1]  # the check itself


def test_config_fields_and_knob_validation():
    names = [f.name for f in config_fields("dp")]
    assert names[:4] == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"]
    assert coerce_knobs("dp", {"BLOCK_M": "64", "num_warps": 8}) == {"BLOCK_M": 64, "num_warps": 8}
    with pytest.raises(AdvisorError, match="unknown knob"):
        coerce_knobs("dp", {"EVIL": 1})
    with pytest.raises(AdvisorError, match="expected a int"):
        coerce_knobs("dp", {"BLOCK_M": "64; import os"})


@pytest.mark.interpreter
def test_generated_dp_variant_checks_under_interpreter(tmp_path):
    path = tmp_path / "variant_dp.py"
    v = generate("dp", 100, 90, 200, dtype="fp32", finding={"kernel": HOSTILE, "evidence": {"note": HOSTILE}}, path=path)
    text = path.read_text()
    tree = ast.parse(text)
    # The hostile text exists only inside string constants.
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any(HOSTILE == c for c in consts)
    # ...and nowhere as code: no name or call outside string literals mentions it.
    assert not any(isinstance(n, ast.Name) and n.id == "__import__" for n in ast.walk(tree))
    r = _run(path, "--check", "--shape", "37x29x70", "--dtype", "fp32", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["check"]["ok"] and out["check"]["rel_err"] < 1e-3
    assert not (tmp_path / "PWNED").exists()
    assert v.knobs["BLOCK_M"] in (16, 32, 64, 128, 256)


@pytest.mark.interpreter
def test_generated_split_k_variant_bf16_under_interpreter(tmp_path):
    path = tmp_path / "variant_sk.py"
    generate("split_k", 64, 48, 4096, dtype="bf16", knobs={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32}, path=path)
    r = _run(path, "--check", "--shape", "19x33x300", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["check"]["ok"] and out["check"]["rel_err"] < 1e-2  # bf16 output rounding


@pytest.mark.interpreter
def test_generated_persistent_fp32_copy_beside_variant_on_misaligned_shape(tmp_path):
    # a variant with copy_beside's knobs, checked on a shape TMA cannot read (70 fp32 = 280
    # bytes a row is fine, 29 and 37 are not): the variant drops to pointer loads, and must
    # drop copy_sms with TMA (a pointer-load config with copy_sms is refused); then an aligned
    # shape, where copy_beside runs (copying forced: the shape is too small to pay)
    path = tmp_path / "variant_pc.py"
    knobs = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2,
             "use_tma": True, "copy_sms": 2, "copy_chunks": 3}
    generate("persistent", 64, 96, 48, dtype="fp32", knobs=knobs, path=path)
    env = {"ADVISOR_NUM_SMS": "3", "ADVISOR_TF32_KMAJOR": "1"}
    for shape in ("37x29x70", "64x96x48"):
        r = subprocess.run([sys.executable, str(path), "--check", "--shape", shape, "--json"], cwd=tmp_path,
                           env=dict(os.environ, TRITON_INTERPRET="1", **env), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout)
        assert out["check"]["ok"] and out["check"]["rel_err"] < 1e-3, (shape, out)


@pytest.mark.interpreter
def test_generated_persistent_staged_variant_on_misaligned_shape(tmp_path):
    # a staged TMA variant on a shape TMA cannot read: it stays on TMA and stages the
    # operands itself (the variant's pointer-load fallback kept staged=True on a pointer
    # config, which the schedule refuses)
    path = tmp_path / "variant_ps.py"
    knobs = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2,
             "use_tma": True, "staged": True}
    generate("persistent", 64, 96, 48, dtype="bf16", knobs=knobs, path=path)
    r = subprocess.run([sys.executable, str(path), "--check", "--shape", "37x29x70", "--json"], cwd=tmp_path,
                       env=dict(os.environ, TRITON_INTERPRET="1", ADVISOR_NUM_SMS="3"), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["check"]["ok"] and out["check"]["rel_err"] < 1e-2, out


def test_generate_rejects_bad_requests(tmp_path):
    with pytest.raises(AdvisorError):
        generate("nope", 1, 1, 1)
    with pytest.raises(AdvisorError):
        generate("dp", 0, 1, 1)
    with pytest.raises(AdvisorError):
        generate("dp", 64, 64, 64, dtype="int8")
    with pytest.raises(AdvisorError, match="generate_grouped"):
        generate("grouped", 64, 64, 64)
    with pytest.raises(AdvisorError):
        generate_grouped([])
    with pytest.raises(AdvisorError):
        generate_grouped([(64, 64, 0)])


def test_generate_cli(tmp_path):
    out = tmp_path / "v.py"
    r = CliRunner().invoke(cli, ["generate", "dp", "--shape", "64x64x128", "--dtype", "bf16", "--config", "BLOCK_M=64", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "BLOCK_M=64" in r.output and out.is_file()
    assert "set by --config: BLOCK_M" in r.output  # not "chosen by the model" alone
    r = CliRunner().invoke(cli, ["generate", "dp", "--shape", "64x64", "-o", str(out)])
    assert r.exit_code == 2 and "MxNxK" in r.output


def test_generate_comm_overlap_tips_the_p2p_transport(tmp_path):
    out = tmp_path / "co.py"
    r = CliRunner().invoke(cli, ["generate", "comm_overlap", "--shape", "4096x4096x4096", "-o", str(out)])
    assert r.exit_code == 0 and "transport=nccl" in r.output and "--config transport=p2p" in r.output
    r = CliRunner().invoke(cli, ["generate", "comm_overlap", "--shape", "4096x4096x4096", "--config", "transport=nccl",
                                 "-o", str(out)])
    assert r.exit_code == 0 and "tip:" not in r.output


def test_generate_says_when_warp_specialization_is_off(tmp_path):
    # the model's pick for a tiny shape runs without producer/consumer warp groups: say so
    # (and how to force them), but not when the user asked for that knob
    out = tmp_path / "ws.py"
    r = CliRunner().invoke(cli, ["generate", "warp_specialization", "--shape", "17x33x1000", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "warp_specialize=False" in r.output and "--config warp_specialize=true forces it" in r.output
    r = CliRunner().invoke(cli, ["generate", "warp_specialization", "--shape", "17x33x1000",
                                 "--config", "warp_specialize=false", "-o", str(out)])
    assert r.exit_code == 0 and "forces it" not in r.output


# knobs of the right type that the schedule's Config or its matmul refuses: every strategy
# generate offers, with the kernel module's own message naming the knob and what is allowed
REFUSED_KNOBS = [
    ("split_k", "SPLIT_K=-1", "SPLIT_K=-1: must be a positive integer"),
    ("split_k", "reduction=bogus", "reduction='bogus': must be one of"),
    ("split_k", "BLOCK_M=48", "BLOCK_M=48: must be a power of two"),
    ("split_k", "num_warps=3", "num_warps=3: must be 1, 2, 4, 8 or 16"),
    ("split_k", "num_stages=12", "shared memory"),  # matmul's launch-time check
    ("dp", "BLOCK_K=24", "BLOCK_K=24: must be a power of two"),
    ("persistent", "PROGRAMS_PER_SM=5", "PROGRAMS_PER_SM=5: must be 1..4"),
    ("stream_k", "policy=bogus", "policy='bogus': must be one of"),
    ("warp_specialization", "num_warps=3", "num_warps must be 4 or 8"),
    ("cluster_gemm", "multicast=true", "multicast needs"),  # M=17: one tile row, the model picks cluster=1
    ("cluster_gemm", "BLOCK_K=128", "shared memory"),  # M=17: the 64x128 tile, 8 stages of 128-deep K
    ("grouped", "num_warps=3", "num_warps must be 1, 2, 4 or 8"),
    ("comm_overlap", "chunks=0", "chunks must be a positive integer"),
    ("comm_overlap", "transport=bogus", "transport must be 'nccl' or 'p2p'"),
    ("split_kv", "BLOCK_N=48", "BLOCK_N=48: must be a power of two"),
]


def test_every_generate_strategy_has_a_refused_knob_case():
    choices = next(p for p in cli.commands["generate"].params if p.name == "strategy").type.choices
    assert {s for s, _, _ in REFUSED_KNOBS} == set(choices)


@pytest.mark.parametrize(("strategy", "knob", "why"), REFUSED_KNOBS)
def test_generate_refuses_knobs_the_schedule_refuses(tmp_path, strategy, knob, why):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out = tmp_path / "v.py"
    shape = {"grouped": ["--shapes", "64x64x64"], "split_kv": ["--attn", "1:32:8:128:4096"]}.get(strategy, ["--shape", "17x33x1000"])
    r = CliRunner().invoke(cli, ["generate", strategy, *shape, "--config", knob, "-o", str(out)])
    assert r.exit_code == 2, r.output
    assert why in r.output and f"{strategy} knobs:" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
    assert not out.exists()


@pytest.mark.slow
def test_generated_variant_refuses_an_empty_or_negative_check_shape(tmp_path):
    # the schedules refuse empty problems (common.check_matmul_inputs raises "empty problem"),
    # so the variant's --shape says so before any tensor is made, instead of a traceback
    pytest.importorskip("torch")
    path = tmp_path / "v.py"
    generate("dp", 64, 64, 64, path=path)
    for shape in ("0x7x9", "7x0x9", "7x9x0", "-1x7x9", "7x9"):
        r = _run(path, "--check", f"--shape={shape}", cwd=tmp_path)
        assert r.returncode == 2, (shape, r.stderr[-2000:])
        assert "--shape must look like" in r.stderr and "at least 1" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr, r.stderr


_SCHEDULE_KERNELS = {"dp": "dp_gemm_kernel", "split_k": "split_k_gemm_kernel", "persistent": "persistent_gemm_kernel",
                     "stream_k": "stream_k_gemm_kernel", "warp_specialization": "ws_gemm_kernel"}


@pytest.mark.parametrize("strategy", sorted(_SCHEDULE_KERNELS))
def test_a_variant_carries_its_schedule_not_the_library(tmp_path, strategy):
    # the chosen schedule's kernel, config and launcher (and the dp baseline the bench times),
    # not the other schedules, the search spaces or runtime.py's Triton internals
    text = generate(strategy, 1664, 1408, 8192, path=tmp_path / "v.py").source
    kernels = {name for name, k in _SCHEDULE_KERNELS.items() if f"def {k}(" in text}
    assert kernels == {strategy, "dp"}
    assert "inlined from kernels/runtime_plain.py" in text and "inlined from kernels/runtime.py" not in text
    for library_only in ("class _Step", "def _build_step", "TMA_POINTS", "def plausible_policies", "def self_check",
                         "def random_inputs", "class ZeroedScratch" if strategy in ("dp", "persistent") else "\x00"):
        assert library_only not in text, library_only
    if strategy != "warp_specialization":  # WS's default config is its search space's first entry
        assert "def search_space" not in text


def test_the_runtime_stand_in_launches_plainly_without_advisor(monkeypatch):
    # a variant run where advisor is not installed: runtime_plain's fallback
    import sys
    import types

    from advisor.resources import kernels_dir

    monkeypatch.setitem(sys.modules, "advisor.codegen.kernel_lib", None)  # importing it raises ImportError
    plain = types.ModuleType("plain")
    exec(compile((kernels_dir() / "runtime_plain.py").read_text(), "runtime_plain.py", "exec"), plain.__dict__)
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k)) or "compiled"

    assert plain.call_key("dp", ()) is None and plain.replay(None) is False
    rec = plain.Recorder(None, lambda a, b: (a, b, "scratch"), "a", "b")
    assert rec.live == ("a", "b", "scratch")
    assert rec.launch(Kernel(), (3,), 1, X=2) == "compiled" and plain.launch(Kernel(), (4,), 5) == "compiled"
    assert calls == [((3,), (1,), {"X": 2}), ((4,), (5,), {})]
    rec.commit()


@pytest.mark.interpreter
def test_a_stream_k_variant_checks_without_advisor_installed(tmp_path):
    # the variant on its own: an `advisor` package that cannot be imported first on the path
    shadow = tmp_path / "shadow" / "advisor"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("advisor is not installed here")\n')
    path = tmp_path / "v.py"
    generate("stream_k", 1664, 1408, 8192, path=path)
    env = dict(os.environ, TRITON_INTERPRET="1", ADVISOR_NUM_SMS="4", PYTHONPATH=str(shadow.parent))
    r = subprocess.run([sys.executable, str(path), "--check", "--shape", "70x48x96", "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["check"]["ok"]


# ------------------------------------------------------------------------- grouped


ODD_GROUP = "17x33x70,45x17x29,70x51x19"  # three GEMMs, odd sizes in 17..70: masks everywhere, no TMA


def _imported_modules(tree: ast.AST) -> set[str]:
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mods.add("." * node.level + (node.module or ""))
    return mods


def _check_standalone(path: Path) -> ast.Module:
    text = path.read_text()
    compile(text, str(path), "exec")
    tree = ast.parse(text)
    mods = _imported_modules(tree)
    assert not [m for m in mods if m.startswith((".", "advisor", "kernels", "advisor_kernels"))], sorted(mods)
    return tree


def test_parse_group_and_shapes():
    assert parse_group("64:128:512") == {"count": 64, "lo": 128, "hi": 512, "seed": 0}
    assert parse_group(" 3:17:70:5 ") == {"count": 3, "lo": 17, "hi": 70, "seed": 5}
    for bad, why in (("3:17", "COUNT:LO:HI"), ("a:b:c", "COUNT:LO:HI"), ("3:17:70:1:2", "COUNT:LO:HI"),
                     ("0:17:70", "COUNT"), ("3:70:17", "LO <= HI"), ("3:0:70", "LO <= HI"), ("3:1:5", "multiples of 8")):
        with pytest.raises(AdvisorError, match=why):
            parse_group(bad)
    # the same draw as the bench's --grouped (advisor.run.bench.grouped, which bench/bench_gemm.py's jobs use)
    from advisor.run.bench.grouped import group_sizes as bench_draw

    spec = parse_group("5:17:70:3")
    assert group_sizes(spec) == [tuple(s) for s in bench_draw(5, 17, 70, 3)]
    assert group_sizes(parse_group("64:128:512")) == [tuple(s) for s in bench_draw()]  # the bench suite's default
    assert parse_shapes(ODD_GROUP) == [(17, 33, 70), (45, 17, 29), (70, 51, 19)]
    for bad in ("17x33", "17x33x70,", "17x33x70;45x17x29", ""):
        with pytest.raises(AdvisorError, match="MxNxK"):
            parse_shapes(bad)


@pytest.mark.interpreter
def test_generated_grouped_variant_fp16_checks_under_interpreter(tmp_path):
    path = tmp_path / "grouped_fp16.py"
    r = CliRunner().invoke(cli, ["generate", "grouped", "--shapes", ODD_GROUP, "--dtype", "fp16", "-o", str(path)])
    assert r.exit_code == 0, r.output
    assert "3 GEMMs" in r.output and "default_config" in r.output
    tree = _check_standalone(path)
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert {"variant_grouped_matmul", "variant_plan", "run_check", "run_bench", "grouped_matmul"} <= names
    text = path.read_text()
    assert "SIZES = [[17, 33, 70], [45, 17, 29], [70, 51, 19]]" in text and "GROUP = None" in text
    p = _run(path, "--check", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["dtype"] == "fp16" and out["gemms"] == 3 and out["sizes"][2] == [70, 51, 19]
    assert out["check"]["ok"] and out["check"]["rel_err"] < 2e-3
    p = _run(path, "--check", "--shapes", "17x33", cwd=tmp_path)
    assert p.returncode == 2 and "--shapes" in p.stderr


@pytest.mark.slow
@pytest.mark.interpreter
def test_generated_grouped_variant_fp32_checks_under_interpreter(tmp_path):
    from advisor.codegen.kernel_lib import load

    torch = pytest.importorskip("torch")
    path = tmp_path / "grouped_fp32.py"
    spec = parse_group("2:17:70:7")
    sizes = group_sizes(spec) + parse_shapes("33x19x53")
    v = generate_grouped(sizes, dtype="fp32", group=spec, finding={"kernel": HOSTILE}, path=path)
    tree = _check_standalone(path)
    assert any(isinstance(n, ast.Constant) and n.value == HOSTILE for n in ast.walk(tree))
    assert not any(isinstance(n, ast.Name) and n.id == "__import__" for n in ast.walk(tree))
    # the baked config is the schedule's default_config for this group
    from dataclasses import asdict

    assert v.knobs == asdict(load("grouped").default_config(sizes, torch.float32, 132))
    assert v.sizes == sizes and (v.M, v.N, v.K) == tuple(max(s[i] for s in sizes) for i in range(3))
    p = _run(path, "--check", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "check ok: 3 GEMMs" in p.stdout
    assert not (tmp_path / "PWNED").exists()


def test_generate_grouped_cli_errors(tmp_path):
    out = tmp_path / "g.py"
    cases = [
        (["grouped"], "--group COUNT:LO:HI"),
        (["grouped", "--group", "3:17"], "COUNT:LO:HI[:SEED]"),
        (["grouped", "--group", "3:70:17"], "LO <= HI"),
        (["grouped", "--group", "3:1:5"], "multiples of 8"),
        (["grouped", "--shapes", "17x33,45x17x29"], "MxNxK"),
        (["grouped", "--shape", "64x64x64"], "not --shape"),
        (["grouped", "--shapes", "64x64x64", "--config", "nope=1"], "unknown knob"),
        (["grouped", "--shapes", "64x64x64", "--config", "block_m=48"], "power of two"),
        (["grouped", "--shapes", "64x64x64", "--config", "lpt_order=1; import os"], "expected a bool"),
        (["dp", "--group", "3:17:70"], "for the grouped strategy"),
        (["split_k", "--shapes", "64x64x64"], "for the grouped strategy"),
        (["dp"], "needs --shape MxNxK"),
    ]
    for args, why in cases:
        r = CliRunner().invoke(cli, ["generate", *args, "-o", str(out)])
        assert r.exit_code == 2, (args, r.output)
        assert why in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)
    assert not out.exists()
    # --group and --shapes together: the drawn GEMMs, then the listed ones; a knob override is kept
    r = CliRunner().invoke(cli, ["generate", "grouped", "--group", "2:17:70:7", "--shapes", "33x19x53", "--dtype", "bf16",
                                 "--config", "block_m=32", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert f"SIZES = {[list(s) for s in group_sizes(parse_group('2:17:70:7'))] + [[33, 19, 53]]}" in text
    assert "'block_m': 32" in text and "'overridden': ['block_m']" in text
    assert "grouped" in CliRunner().invoke(cli, ["generate", "--help"]).output


# ------------------------------------------------------------------------- the model


def test_model_prefers_split_k_for_skinny_long_k():
    dev = Device()
    M, N, K = 256, 256, 131072
    s = suggest_split_k(M, N, K, 128, 128, 64, dev.sm_count)
    assert s == 32  # 132 // 4 tiles = 33, capped at max_split 32
    dp = predict("dp", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, M, N, K, 2, dev)
    sk = predict("split_k", {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "SPLIT_K": s}, M, N, K, 2, dev)
    assert sk.predicted_us < dp.predicted_us / 5
    # Memory floor: 134 MB at 4.3 TB/s is ~31 us; split-K cannot beat it.
    assert sk.predicted_us >= 2 * (M * K + K * N + M * N) / dev.bandwidth_bytes_per_s * 1e6


def test_model_stream_k_policy_on_tail_and_balanced():
    dev = Device()
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    # 143 tiles: the hybrid beats plain dp; 132 tiles: only dp is worth timing.
    assert stream_k_policies(143, 132)[0] == "hybrid1"
    assert stream_k_policies(132, 132) == ["dp"]
    assert stream_k_policies(4, 132) == ["sk", "dp"]
    # H200 (2026-11-29): contiguous hybrid1 78-83 us, dp (two waves) 86-90, all-Stream-K
    # 90-98; the aligned hybrid 60-63
    ranked = rank("stream_k", [dict(cfg, policy=p) for p in ("dp", "hybrid1", "sk")], 1664, 1408, 8192, 2, dev)
    assert [p.config["policy"] for p in ranked] == ["hybrid1", "dp", "sk"]
    dp = predict("stream_k", dict(cfg, policy="dp"), 1664, 1408, 8192, 2, dev)
    assert ranked[0].predicted_us < 0.95 * dp.predicted_us
    aligned = predict("stream_k", dict(cfg, policy="hybrid1", aligned=True), 1664, 1408, 8192, 2, dev)
    assert aligned.predicted_us < 0.75 * dp.predicted_us


def test_model_tf32_rate():
    # fp32 inputs run as tf32 at half the 16-bit tensor rate: a compute-bound GEMM's compute
    # term doubles, its memory term only follows the bytes. H200, 2026-12-01: 8192^3 took
    # 3244 us with tf32 (persistent) and ~1600 us in bf16 (docs/results.md).
    dev = Device()
    cfg = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
    bf16 = predict("persistent", cfg, 8192, 8192, 8192, 2, dev)
    fp32 = predict("persistent", dict(cfg, BLOCK_K=32), 8192, 8192, 8192, 4, dev)
    assert fp32.compute_us == pytest.approx(2 * bf16.compute_us)
    assert fp32.memory_us == pytest.approx(2 * bf16.memory_us, rel=1e-6)
    assert 2500 < fp32.predicted_us < 4000 and 1200 < bf16.predicted_us < 2000


def test_model_prunes_hopeless():
    dev = Device()
    cfgs = [{"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}]
    ranked = rank("dp", cfgs, 8192, 8192, 8192, 2, dev, keep_at_least=1)
    assert all(p.config["BLOCK_M"] != 16 for p in ranked)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["all_gather_matmul", "matmul_reduce_scatter"])
def test_comm_overlap_variant_runs_under_torchrun_gloo(tmp_path, pattern):
    path = tmp_path / "overlap.py"
    r = CliRunner().invoke(cli, ["generate", "comm_overlap", "--shape", "64x24x32", "--dtype", "fp32", "--pattern", pattern,
                                 "--config", "chunks=3", "-o", str(path)])
    assert r.exit_code == 0, r.output
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(path), "--check", "--json"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout[p.stdout.index("{"):])
    assert out["check"]["ok"] and out["check"]["world_size"] == 2 and out["knobs"]["chunks"] == 3
    text = path.read_text()
    assert "NCCL_NVLS_ENABLE" in text and f"PATTERN = '{pattern}'" in text


def test_comm_overlap_generate_warns_of_world_sizes_the_shape_cannot_split(tmp_path):
    assert comm_shape_warnings("all_gather_matmul", 64, 1001) == []  # K stays whole on every rank
    assert comm_shape_warnings("matmul_reduce_scatter", 64, 1000) == []
    (w,) = comm_shape_warnings("matmul_reduce_scatter", 12, 1000)
    assert "M=12 is not divisible by 8" in w and "--nproc-per-node 8" in w and "use 2 or 4" in w
    (w,) = comm_shape_warnings("matmul_reduce_scatter", 64, 1001)
    assert "K=1001 is not divisible by 2, 4, 8" in w and "M=" not in w
    out = tmp_path / "overlap.py"
    for pattern in ("all_gather_matmul", "matmul_reduce_scatter"):
        r = CliRunner().invoke(cli, ["generate", "comm_overlap", "--shape", "17x33x1000", "--pattern", pattern,
                                     "-o", str(out)])
        assert r.exit_code == 0 and out.is_file(), r.output
        warned = [line for line in r.output.splitlines() if line.startswith("advisor: warning:")]
        assert len(warned) == 1 and "M=17 is not divisible by 2, 4, 8" in warned[0], r.output
    r = CliRunner().invoke(cli, ["generate", "comm_overlap", "--shape", "64x24x32", "-o", str(out)])
    assert r.exit_code == 0 and "warning" not in r.output, r.output


def test_comm_overlap_variant_without_torchrun_says_to_use_it(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "overlap.py"
    generate_comm_overlap("all_gather_matmul", 64, 24, 32, dtype="fp32", path=path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([sys.executable, str(path), "--check"], check=False, cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr  # one line, no traceback
    assert "launch it with torchrun" in p.stderr and "torchrun --nproc-per-node 2 overlap.py --check" in p.stderr


@pytest.mark.slow
def test_comm_overlap_variant_stops_on_a_world_size_that_does_not_split_the_shape(tmp_path):
    path = tmp_path / "overlap.py"
    generate_comm_overlap("matmul_reduce_scatter", 17, 24, 32, dtype="fp32", path=path)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(path), "--check"],
                       check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    msg = ("matmul_reduce_scatter splits M and K evenly over the ranks: M=17 is not divisible by the world size 2; "
           "launch with a --nproc-per-node that divides M=17 and K=32")
    # torchrun ends the other ranks as soon as one fails, so how many print it before that is a race
    assert p.stderr.count(msg) >= 1, p.stderr[-3000:]
    # each rank stops on its own, before any communicator: launched alone (the environment
    # torchrun gives it), a rank that reached init_process_group would wait for its peer
    for rank in (0, 1):
        solo = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
        q = subprocess.run([sys.executable, str(path), "--check"], check=False, cwd=tmp_path, env=solo,
                           capture_output=True, text=True, timeout=120)
        assert q.returncode != 0 and q.stderr.count(msg) == 1, (rank, q.stderr[-3000:])


def test_a_variant_s_replay_keys_are_its_own(monkeypatch):
    # with advisor importable, runtime_plain uses runtime.py's replays, keyed apart from the
    # library's (a variant and the library in one process must not replay each other's launches)
    import types

    from advisor.codegen.kernel_lib import load
    from advisor.resources import kernels_dir

    runtime = load("runtime")
    seen = []
    monkeypatch.setattr(runtime, "call_key", lambda tag, tensors, *extra: seen.append(tag) or ("key", tag))
    plain = types.ModuleType("plain")
    exec(compile((kernels_dir() / "runtime_plain.py").read_text(), "runtime_plain.py", "exec"), plain.__dict__)
    assert plain.launch is runtime.launch and plain.Recorder is runtime.Recorder
    key = plain.call_key("stream_k", (), "cfg")
    assert seen[0][0] == "stream_k" and seen[0] != "stream_k" and key == ("key", seen[0])


def test_write_variant_is_the_front_door_the_cli_prints(tmp_path):
    # the checks and the messages live in the codegen layer; the CLI only prints them
    from advisor.codegen.generate import write_variant

    w = write_variant("split_k", tmp_path / "v $(x).py", shape="64x64x4096", dtype="bf16")
    assert w.lines[0].startswith("wrote ") and "split_k, 64x64x4096 bf16" in w.lines[0]
    assert w.lines[-1].startswith("next: python '") and "$(x)" in w.lines[-1]  # quoted for the shell
    assert (tmp_path / "v $(x).py").exists()
    with pytest.raises(AdvisorError, match="--attn is for the split_kv strategy"):
        write_variant("split_k", tmp_path / "w.py", shape="64x64x64", attn="1:8:8:64:1024")
    with pytest.raises(AdvisorError, match="needs --shape"):
        write_variant("stream_k", tmp_path / "w.py")
    out = CliRunner().invoke(cli, ["generate", "split_k", "--shape", "64x64x4096", "-o", str(tmp_path / "c.py")])
    assert out.exit_code == 0 and out.output.splitlines()[0] == f"wrote {tmp_path / 'c.py'} (split_k, 64x64x4096 bf16)"
