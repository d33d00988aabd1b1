"""Hostile traces: text from a trace never reaches a report or generated code unescaped, and
reports never repeat the environment, user and host names or paths a trace records.

Traces come from machines and programs we do not control, and their reports get pasted into
pull requests. Here kernel names, NVTX/annotation text and file names carry Python code
(breaking out of string literals), jinja syntax, markdown links and images, HTML and
script tags, backticks, newlines, ANSI escapes and bidi/control characters, in both an nsys
SQLite export and a Kineto JSON trace, with a GEMM shape so that findings fire and
`advisor diagnose --run` generates a variant (whose FINDING header embeds the finding).

Proof, not inspection:
- the markdown is rendered by a CommonMark parser (markdown-it-py, GFM tables): no HTML,
  link or image token, and only advisor's own headings; no raw control characters;
- the JSON round-trips and gives agents the exact original strings;
- the generated file compiles; in its AST every planted fragment lies inside a string
  literal (the source with all string literals blanked out contains none), and FINDING
  evaluates back to the original text; running it (`--check` on a small shape under the
  Triton CPU interpreter) passes and the planted code, which would create a marker file,
  did not run.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt

import tracefiles as T
from advisor.cli import cli

REPO = Path(__file__).resolve().parents[1]


def payload(marker: Path) -> str:
    """Every kind of hostile text at once; the Python parts would create `marker`."""
    return (
        f'gemm_kernel"""; import os; os.system("touch {marker}") #'
        f"''' + __import__('os').system('touch {marker}') + '''"
        " \\ {{ 7*7 }} {% raw %} {{ config.items() }} {# x"
        " | ** [click](http://evil.example/a) ![img](http://evil.example/i.png) <https://evil.example/auto>"
        ' <script>alert(1)</script><img src=x onerror=alert(1)><a href="http://evil.example/h">h</a>'
        " `tick` ``` ````"
        "\n# injected heading\n| a | b |\n"
        "\x1b[31mred\x1b[0m\x1b]8;;http://evil.example\x07link\x1b]8;;\x07"
        " \u202eexe.txt\u202c \u2066iso\u2069 \u200bzw \x00nul \x07bell \r\n"
    )


# Fragments that must never appear outside a string literal in generated code, nor as
# markup in a report (each is specific to the payload, so a hit is an injection).
FRAGMENTS = ("evil.example", "{{ 7*7 }}", "{% raw %}", "<script>", "onerror=", "__import__('os')", "# injected heading")


def hostile_file_name() -> str:
    # anything Linux allows in a name: quotes, backticks, $(), markup, escapes, newline
    return "evil `x` $(touch pwn) <b>'\"{{7*7}}|[l](javascript:alert(1))\x1b[31m\u202e\n.trace"  # no '/' in a name


def kineto_trace(path: Path, marker: Path) -> tuple[Path, str]:
    evil = payload(marker)
    events = T.kineto_gemm_events(6, kernel_name=evil, annotation=evil.replace("gemm_kernel", "step"))
    doc = T.kineto_doc(events, traceName=evil, distributedInfo={"rank": 0, "backend": evil})
    doc["deviceProperties"] = [dict(T.H100_PROPS, name="NVIDIA H100 80GB HBM3 <b>x</b>")]
    return T.write_kineto(path, doc), evil


def nsys_trace(path: Path, marker: Path) -> tuple[Path, str]:
    evil = payload(marker)
    tables = T.nsys_tables(6, kernel_name=evil, short_name=evil[:40])
    # the shape ranges stay parseable; add ranges whose text is the payload itself
    decls, nvtx = tables["NVTX_EVENTS"]
    extra = [dict(r, text=evil, start=r["start"] - 10, end=r["end"] + 10) for r in nvtx]
    tables["NVTX_EVENTS"] = (decls, nvtx + extra)
    return T.write_nsys(path, tables), evil


BUILDERS = {"kineto": kineto_trace, "nsys": nsys_trace}


def rendered_markdown(text: str) -> tuple[str, list]:
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    tokens = md.parse(text)
    return md.renderer.render(tokens, md.options, {}), tokens


def flat(tokens: list) -> list:
    out = []
    for t in tokens:
        out.append(t)
        out.extend(flat(t.children or []))
    return out


def assert_safe_markdown(text: str, own_images: tuple[str, ...] = ()) -> None:
    for ch in ("\x1b", "\x00", "\x07", "\u202e", "\u2066", "\u200b", "\r"):
        assert ch not in text, f"raw {ch!r} in the report"
    html, tokens = rendered_markdown(text)
    toks = flat(tokens)
    kinds = {t.type for t in toks}
    assert not kinds & {"html_inline", "html_block", "link_open"}, kinds
    images = [t.attrs.get("src") for t in toks if t.type == "image"]
    assert all(src in own_images for src in images), images
    headings = [toks[i + 1].content for i, t in enumerate(toks) if t.type == "heading_open"]
    assert not any("injected" in h for h in headings), headings
    assert "<script" not in html and "<img src=\"x\"" not in html and 'href="http' not in html
    # everything planted survives only as text: outside code spans it is escaped
    for t in toks:
        if t.type == "text":
            for frag in ("<script>", "[click](http://evil.example/a)", "![img]("):
                assert frag not in t.content or t.content.count("\\") > 0, t.content


def code_outside_strings(source: str) -> str:
    """`source` with every string literal (and f-string) blanked out: what is left is code
    and comments."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    raw = bytearray(source.encode("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and isinstance(getattr(node, "value", ""), (str, type(None))):
            if isinstance(node, ast.Constant) and not isinstance(node.value, str):
                continue
            a = offsets[node.lineno - 1] + node.col_offset
            b = offsets[node.end_lineno - 1] + node.end_col_offset
            raw[a:b] = b" " * (b - a)
    return raw.decode("utf-8", "replace")


def assigned_literal(source: str, name: str):
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned in the generated file")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_hostile_trace_reports_are_inert(workdir, fmt):
    marker = workdir / "PWNED"
    path, evil = BUILDERS[fmt](workdir / hostile_file_name(), marker)
    runner = CliRunner()

    md = runner.invoke(cli, ["diagnose", str(path)])
    assert md.exit_code == 0, md.output
    assert "| 1 | 4 | tail_wave | stream_k |" in md.stdout  # the finding fired on the hostile kernel
    assert_safe_markdown(md.stdout)

    js = runner.invoke(cli, ["diagnose", "--json", str(path)])
    assert js.exit_code == 0, js.output
    report = json.loads(js.stdout)
    assert report["findings"] and all(f["kernel"] == evil for f in report["findings"])  # exact text for agents
    assert report["trace"]["sources"] == [path.name]
    assert json.loads(json.dumps(report)) == report

    for args in (["summary", str(path)], ["summary", "--json", str(path)]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 0, r.output
        if "--json" in args:
            assert json.loads(r.stdout)["top_kernels"][0]["name"] == evil
        else:
            for ch in ("\x1b", "\x00", "\u202e", "\r"):
                assert ch not in r.stdout
            assert r.stdout.count("\n") == len(r.stdout.splitlines())  # the name did not add lines
            assert not any(line.startswith("# injected") for line in r.stdout.splitlines())
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_terminal_report_is_unescaped_and_still_inert(workdir, fmt, monkeypatch):
    """On a terminal the report drops md_escape's backslashes (`two\\_phase` read badly), and
    the hostile text still adds no control characters and no lines."""
    path, _ = BUILDERS[fmt](workdir / hostile_file_name(), workdir / "PWNED")
    runner = CliRunner()
    piped = runner.invoke(cli, ["diagnose", str(path)]).stdout
    monkeypatch.setattr("advisor.cli._stdout_is_tty", lambda: True)
    shown = runner.invoke(cli, ["diagnose", str(path)])
    assert shown.exit_code == 0, shown.output
    tty = shown.stdout
    assert "\\_" in piped and tty != piped
    assert tty.count("\n") == piped.count("\n")
    for ch in ("\x1b", "\x00", "\x07", "\u202e", "\u2066", "\u200b", "\r"):
        assert ch not in tty
    assert not any(line.startswith("# injected") for line in tty.splitlines())
    # table rows keep their cells: every row of the findings table has the header's column count
    rows = [line for line in tty.splitlines() if line.startswith("| ")]
    head = rows[0]
    def cells(line: str) -> int:
        return len(line.replace("\\|", "").split("|"))

    assert all(cells(r) == cells(head) for r in rows if r.startswith(("| 1 ", "| 2 ", "| # ")))


def test_md_for_terminal():
    from advisor.textutil import md_escape, md_for_terminal, safe_text

    assert md_for_terminal(r"reduction = two\_phase; torch.\_foreach\_\* ops &amp; a &lt;b&gt;") == (
        "reduction = two_phase; torch._foreach_* ops & a <b>")
    assert md_for_terminal(r"name `a\_b` and ``x`y\_z`` then \_") == r"name `a\_b` and ``x`y\_z`` then _"
    assert md_for_terminal("```\nx\\_y\n```\nz\\_w") == "```\nx\\_y\n```\nz_w"
    assert md_for_terminal(r"| a \| b | c\_d |") == r"| a \| b | c_d |"  # a pipe stays escaped in tables
    assert md_for_terminal(r"an open \` tick and a\_b") == "an open ` tick and a_b"
    # escaping then unescaping gives back the safe_text line (controls still shown as escapes)
    for text in ("k<a_b, *c|d> & [x](y) &amp; $x$ ~y~", "\x1b[31m\u202e \\ back", "`tick` ``` x"):
        assert md_for_terminal(md_escape(text, limit=400)) == safe_text(text, 400)


@pytest.mark.slow
def test_hostile_finding_generates_inert_code_that_runs(workdir):
    marker = workdir / "PWNED"
    path, evil = kineto_trace(workdir / hostile_file_name(), marker)
    out = workdir / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(path), "--run", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert_safe_markdown((out / "report.md").read_text(encoding="utf-8"), own_images=("waves.png",))
    assert_safe_markdown((out / "run_report.md").read_text(encoding="utf-8"), own_images=("before_after.png",))
    variants = sorted(out.glob("variant_*.py"))
    assert [v.name for v in variants] == ["variant_tail_wave_1664x1408x8192.py"]
    source = variants[0].read_text(encoding="utf-8")
    compile(source, variants[0].name, "exec")

    code = code_outside_strings(source)
    for frag in (*FRAGMENTS, str(marker), "\x1b", "\u202e", "\x00"):
        assert frag not in code, f"{frag!r} outside a string literal"
    assert "\\x1b[31m" in source and "\\u202e" in source  # control characters written as escapes
    finding = assigned_literal(source, "FINDING")  # the payload is there, whole, as data
    assert finding["kernel"] == evil and finding["shape"]["M"] == T.TAIL["M"]
    assert isinstance(finding["evidence"]["share_of_gpu_time"], float)

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH="")
    run = subprocess.run([sys.executable, variants[0].name, "--check", "--shape", "33x17x70"], cwd=out, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "check ok" in run.stdout.lower()
    assert not marker.exists() and not (out / "pwn").exists()


def test_direct_generate_from_hostile_findings(workdir):
    """Every finding of a hostile trace, generated through the library (as the bench loop
    does): each file compiles and holds the payload only inside literals."""
    from advisor.diagnose.diagnosis import diagnose
    from advisor.codegen.generate import GEMM_STRATEGIES, finding_summary, generate
    from advisor.traces import load_trace

    marker = workdir / "PWNED"
    path, evil = nsys_trace(workdir / "n.sqlite", marker)
    d = diagnose(load_trace(path))
    shaped = [f for f in d.findings if f.shape and f.strategy in GEMM_STRATEGIES]
    assert {f.strategy for f in shaped} >= {"stream_k", "warp_specialization"}
    for f in shaped:
        v = generate(f.strategy, f.shape["M"], f.shape["N"], f.shape["K"], finding=finding_summary(f))
        compile(v.source, "v.py", "exec")
        code = code_outside_strings(v.source)
        assert not [frag for frag in FRAGMENTS if frag in code]
        assert assigned_literal(v.source, "FINDING")["kernel"] == evil
    assert not marker.exists()


def test_hostile_knobs_are_refused(workdir):
    out = workdir / "v.py"
    for bad in ('policy=hybrid1"; import os #', "BLOCK_M=64; import os", "SPLIT_K=__import__('os')"):
        r = CliRunner().invoke(cli, ["generate", "split_k" if "SPLIT" in bad else "stream_k", "--shape", "64x64x64",
                                     "--config", bad, "-o", str(out)])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.output, r.output
    assert not out.exists()


# ------------------------------------------------------------------------------- privacy

SECRETS = ("secretuser", "secret-host", "/home/", "s3cr3t-token")


def private_nsys(path: Path) -> Path:
    """An nsys export holding what real ones record about the machine: environment
    variables, process command lines and paths, the host name, output file names."""
    tables = T.nsys_tables(6)
    sid = 100
    strings = list(tables["StringIds"][1])
    strings += [(sid, "/home/secretuser/proj/run.py"), (sid + 1, "/home/secretuser/proj/out.log")]
    tables["StringIds"] = (tables["StringIds"][0], strings)
    tables["TARGET_INFO_SYSTEM_ENV"] = (["globalVid INTEGER", "devStateName TEXT", "name TEXT", "nameEnum INTEGER", "value TEXT"],
                                        [(1, "env", "HOME", 1, "/home/secretuser"), (1, "env", "USER", 2, "secretuser"),
                                         (1, "env", "HOSTNAME", 3, "secret-host"), (1, "env", "API_TOKEN", 4, "s3cr3t-token")])
    tables["PROCESSES"] = (["globalPid INTEGER", "pid INTEGER", "name TEXT"], [(4242 << 24, 4242, "/home/secretuser/proj/run.py")])
    tables["ProcessStreams"] = (["globalPid INTEGER", "filenameId INTEGER", "contentId INTEGER"], [(4242 << 24, sid + 1, 0)])
    tables["META_DATA_CAPTURE"] = (["name TEXT", "value TEXT"], [("HOST_NAME", "secret-host"),
                                                                 ("CAPTURE_COMMAND", "nsys profile python /home/secretuser/proj/run.py")])
    tables["META_DATA_EXPORT"] = (["name TEXT", "value TEXT"], [("EXPORT_PRODUCT_VERSION", "2025.3.1"),
                                                                ("EXPORT_SCHEMA_VERSION", "3.x"),
                                                                ("EXPORT_FILE", "/home/secretuser/proj/run.sqlite")])
    tables["TARGET_INFO_GPU"] = (T.GPU_DECLS, [dict(T.H100_GPU)])
    return T.write_nsys(path, tables)


def private_kineto(path: Path) -> Path:
    events = T.kineto_gemm_events(6)
    events += [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python /home/secretuser/proj/run.py"}},
        {"ph": "M", "name": "process_labels", "pid": 1, "tid": 0, "args": {"labels": "secret-host"}},
        {"ph": "X", "cat": "python_function", "name": "/home/secretuser/proj/run.py(12): forward", "pid": 1, "tid": 1,
         "ts": 0.5, "dur": 5000.0, "args": {}},
    ]
    doc = T.kineto_doc(events, traceName="/home/secretuser/proj/trace.json", hostname="secret-host",
                       distributedInfo={"backend": "nccl", "rank": 0, "world_size": 1, "host": "secret-host",
                                        "pg_config": [{"pg_name": "0", "pg_desc": "/home/secretuser"}]},
                       env={"HOME": "/home/secretuser", "API_TOKEN": "s3cr3t-token"})
    return T.write_kineto(path, doc)


@pytest.mark.parametrize("build", [private_nsys, private_kineto], ids=["nsys", "kineto"])
def test_reports_do_not_repeat_machine_details(workdir, build):
    path = build(workdir / ("run.sqlite" if build is private_nsys else "run.json"))
    raw = path.read_bytes()
    assert b"secretuser" in raw and b"secret-host" in raw and b"s3cr3t-token" in raw  # they are in the trace
    out = workdir / "out"
    runner = CliRunner()
    texts = []
    for args in (["summary"], ["summary", "--json"], ["diagnose"], ["diagnose", "--json", "--out", str(out)]):
        r = runner.invoke(cli, [*args, str(path)])
        assert r.exit_code == 0, r.output
        texts.append(r.output)
    texts += [(out / "report.md").read_text(), (out / "report.json").read_text()]
    assert json.loads(texts[-1])["findings"]  # a real diagnosis, not an empty one
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, (secret, text[:400])
