"""Hostile and huge inputs (issue 33): bounded memory on decompression, no writes through
planted symlinks, a cache no one else can poison, no regex blow-up, odd types and values,
no side effects on reading, and no option that runs code taken from the environment.

Each test builds its input here (tmp_path) and fails on the code before the fix it covers.
"""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracefiles as T
from advisor.cli import cli
from advisor.errors import TraceError
from advisor.traces import _inflate, load_trace, nsys_rep


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.delenv(_inflate.ENV, raising=False)
    monkeypatch.setattr(nsys_rep, "STANDARD_LOCATIONS", ())


def run_cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def one_line_error(result, *needles: str) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr
    assert err.startswith("advisor: error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


def gzip_bomb(path: Path, head: bytes, fill: bytes, total: int, tail: bytes = b"") -> Path:
    """A gzip file of `head`, then `fill` repeated to `total` bytes, then `tail`: megabytes on
    disk that inflate to `total`."""
    block = fill * ((1 << 20) // len(fill))
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    with open(path, "wb") as fh:
        fh.write(c.compress(head))
        done = len(head)
        while done < total:
            n = min(len(block), total - done)
            fh.write(c.compress(block[:n]))
            done += n
        fh.write(c.compress(tail))
        fh.write(c.flush())
    return path


# ------------------------------------------------------------------ 1. bounded decompression


def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """256 MiB of whitespace inside a valid Kineto document, under a 32 MiB cap: refused once
    the cap is passed, with no more than a few chunks ever in memory (before: the whole file
    inflated at once, then parsed)."""
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", b'{"traceEvents": [', b" ", 256 << 20, b"]}")
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="max-inflated-bytes") as exc:
            load_trace(bomb, max_inflated_bytes="32M")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "bomb.json.gz" in str(exc.value)
    assert peak < 48 << 20, f"peak {peak >> 20} MiB"


def test_inflate_cap_from_option_and_environment(tmp_path):
    bomb = gzip_bomb(tmp_path / "b.json.gz", b'{"traceEvents": [', b" ", 8 << 20, b"]}")
    one_line_error(run_cli("summary", "--max-inflated-bytes", "4M", str(bomb)), "b.json.gz", "4,194,304")
    one_line_error(run_cli("diagnose", str(bomb), env={_inflate.ENV: "1M"}), "1,048,576")
    bad = run_cli("summary", "--max-inflated-bytes", "lots", str(bomb))
    assert bad.exit_code == 2 and "not a size" in bad.stderr
    # under the default cap the same file is read (and holds no kernels)
    one_line_error(run_cli("summary", str(bomb)), "no GPU kernel activity")
    ok = T.write_kineto(tmp_path / "ok.json", gz=True)
    assert run_cli("summary", "--max-inflated-bytes", "16M", str(ok)).exit_code == 0


def test_parse_size():
    assert _inflate.parse_size("4G") == 4 << 30 and _inflate.parse_size("500M") == 500 << 20
    assert _inflate.parse_size("16GiB") == 16 << 30 and _inflate.parse_size("123") == 123
    for bad in ("0", "-1", "1e400", "G", "4X", "nan", str(2**70)):
        with pytest.raises(ValueError):
            _inflate.parse_size(bad)


def test_multi_member_gzip_reads_whole(tmp_path):
    """gzip concatenation (`cat a.gz b.gz`) is one stream: both members are read."""
    doc = json.dumps(T.kineto_doc()).encode()
    path = tmp_path / "m.json.gz"
    path.write_bytes(gzip.compress(doc[:100]) + gzip.compress(doc[100:]))
    assert len(load_trace(path).kernels) == 6


def test_sqlite_gz_bomb_leaves_nothing_in_the_cache(tmp_path):
    """A .sqlite.gz whose header declares a small database and then inflates on: stopped at
    the declared size, before the cap, and nothing stays in the cache."""
    real = T.write_nsys(tmp_path / "src.sqlite", n=3).read_bytes()
    cache = tmp_path / "cache"
    bomb = gzip_bomb(tmp_path / "run.sqlite.gz", real, b"\x00", 64 << 20)
    one_line_error(run_cli("summary", "--cache-dir", str(cache), str(bomb)), "run.sqlite.gz", "declares")
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()]


def test_sqlite_gz_over_the_cap_leaves_nothing(tmp_path):
    data = bytearray(T.write_nsys(tmp_path / "src.sqlite", n=3).read_bytes())
    data[92:96] = b"\xff\xff\xff\xff"  # version-valid-for no longer matches: size not declared
    cache = tmp_path / "cache"
    bomb = gzip_bomb(tmp_path / "run.sqlite.gz", bytes(data), b"\x00", 16 << 20)
    one_line_error(run_cli("summary", "--cache-dir", str(cache), "--max-inflated-bytes", "2M", str(bomb)),
                   "run.sqlite.gz", "max-inflated-bytes")
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()]


def test_unreadable_decompressed_sqlite_is_not_kept(tmp_path):
    """A .sqlite.gz that inflates completely but is not a usable database: the error names
    the user's file and the copy does not stay in the cache (before: it stayed, 4 GiB)."""
    data = T.write_nsys(tmp_path / "src.sqlite", n=3).read_bytes()
    broken = data[:100] + bytes(range(256)) * ((len(data) - 100) // 256)
    broken += data[len(broken):]
    path = tmp_path / "bad.sqlite.gz"
    path.write_bytes(gzip.compress(broken))
    cache = tmp_path / "cache"
    one_line_error(run_cli("summary", "--cache-dir", str(cache), str(path)), "bad.sqlite.gz")
    assert not cache.exists() or not [p for p in cache.rglob("*.sqlite")]


# ------------------------------------------------------- 2. no writes through planted symlinks


def planted(victim: Path, where: Path) -> Path:
    """A symlink at `where` pointing at `victim`, a file that stands for ~/.bashrc."""
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("echo original\n")
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(victim)
    return victim


def test_out_dir_replaces_planted_symlinks(tmp_path):
    trace = T.write_kineto(tmp_path / "t.json")
    out = tmp_path / "out"
    victims = {name: planted(tmp_path / f"victim-{name}", out / name) for name in ("report.md", "report.json", "waves.png")}
    r = run_cli("diagnose", str(trace), "--out", str(out))
    assert r.exit_code == 0, r.output
    for name, victim in victims.items():
        assert victim.read_text() == "echo original\n", name
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert (out / "report.md").read_text().startswith("# advisor diagnosis")
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_generate_output_replaces_a_planted_symlink(tmp_path):
    target = tmp_path / "v.py"
    victim = planted(tmp_path / "victim", target)
    r = run_cli("generate", "dp", "--shape", "64x64x64", "-o", str(target))
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "echo original\n"
    assert not target.is_symlink() and "def variant_matmul" in target.read_text()


def test_run_rows_replace_planted_symlinks(tmp_path):
    from advisor.run.bench import rows as R
    from advisor.run.counters import write_rows

    for writer, name in ((lambda p: R.append_csv(p, [{"provider": "dp", "median_us": 1.0}]), "rows.csv"),
                         (lambda p: R.write_json(p, [{"a": 1}]), "rows.json"),
                         (lambda p: write_rows(p, [{"metric": "m", "value": 1}]), "counters.csv")):
        victim = planted(tmp_path / f"victim-{name}", tmp_path / "out" / name)
        writer(tmp_path / "out" / name)
        assert victim.read_text() == "echo original\n", name
        assert not (tmp_path / "out" / name).is_symlink()
    R.append_csv(tmp_path / "out" / "rows.csv", [{"provider": "split_k", "median_us": 2.0}])
    assert [r["provider"] for r in R.read_csv(tmp_path / "out" / "rows.csv")] == ["dp", "split_k"]


def sqlite_gz(tmp_path: Path, name: str = "run.sqlite.gz") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(T.write_nsys(tmp_path / "src.sqlite", n=4).read_bytes()))
    return path


def cache_entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.name.endswith(".sqlite"))


def test_cache_refuses_a_directory_others_can_write(tmp_path):
    gz = sqlite_gz(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    one_line_error(run_cli("summary", "--cache-dir", str(shared), str(gz)), "writable by other users", "--cache-dir")
    assert list(shared.iterdir()) == []
    if os.getuid() == 0:  # as root the test can make a directory that belongs to someone else
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        one_line_error(run_cli("summary", "--cache-dir", str(theirs), str(gz)), "belongs to another user")


def test_cache_is_private_and_never_follows_a_planted_link(tmp_path):
    from advisor.traces import _cache

    gz = sqlite_gz(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    name = f"run-{_cache.source_key(gz)}.sqlite"
    victim = planted(tmp_path / "victim", cache / name)
    assert len(load_trace(gz, cache_dir=cache).kernels) == 4
    assert victim.read_text() == "echo original\n"
    (entry,) = cache_entries(cache)
    assert entry.name == name and not entry.is_symlink()
    assert oct(entry.stat().st_mode & 0o777) == oct(0o600)
    fresh = tmp_path / "fresh-cache"
    load_trace(gz, cache_dir=fresh)
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o700)


# ------------------------------------------------------------- 3. a cache that checks what it finds


def test_garbage_cache_entry_is_rebuilt(tmp_path):
    from advisor.traces import _cache

    gz = sqlite_gz(tmp_path)
    cache = tmp_path / "cache"
    assert len(load_trace(gz, cache_dir=cache).kernels) == 4
    (entry,) = cache_entries(cache)
    entry.write_bytes(b"SQLite format 3\x00" + os.urandom(4000))  # garbage under the right name
    assert len(load_trace(gz, cache_dir=cache).kernels) == 4
    entry.write_bytes(entry.read_bytes()[:3000])  # a truncated copy
    assert len(load_trace(gz, cache_dir=cache).kernels) == 4
    assert cache_entries(cache) == [entry]
    # an entry others could have written (mode 0644) is not trusted either
    planted_export = T.write_nsys(tmp_path / "planted.sqlite", n=9)
    entry.write_bytes(planted_export.read_bytes())
    entry.chmod(0o644)
    assert len(load_trace(gz, cache_dir=cache).kernels) == 4
    assert _cache.source_key(gz) in entry.name


def test_cache_key_follows_the_source_content(tmp_path):
    from advisor.traces import _cache

    gz = sqlite_gz(tmp_path)
    key = _cache.source_key(gz)
    data = gz.read_bytes()
    gz.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, new content and mtime
    os.utime(gz, ns=(gz.stat().st_atime_ns, gz.stat().st_mtime_ns + 10**9))
    assert _cache.source_key(gz) != key


# --------------------------------------------------------------------------- 4. regex blow-up

MEGABYTE_NAMES = {
    "nvjet-repeated": "nvjet_" * 174_763,  # 67 s at 240 KB before: a search from every nvjet_
    "nvjet-no-tile": "nvjet_sm90" + "_a" * 524_283,
    "digits": "_" + "1x" * 524_287,
    "cutlass-like": "_12" * 349_525,
    "letters": "a" * (1 << 20),
}


@pytest.mark.parametrize("label", MEGABYTE_NAMES)
def test_megabyte_kernel_names_are_matched_quickly(label):
    import time

    from advisor.symptoms.gemm import tile_from_name

    name = MEGABYTE_NAMES[label]
    t0 = time.perf_counter()
    tile_from_name(name)
    assert time.perf_counter() - t0 < 0.5


def test_tile_patterns_still_read_real_names():
    from advisor.symptoms.gemm import tile_from_name

    assert tile_from_name("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT") == (320, 128, 64)
    assert tile_from_name("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN") == (256, 128, 64)
    assert tile_from_name("nvjet_" + "x" * 5000 + "_128x128_64x3") is None  # past the first 4 KiB


def test_trace_with_megabyte_names_diagnoses_in_seconds(tmp_path):
    import time

    name = MEGABYTE_NAMES["nvjet-repeated"]
    path = T.write_kineto(tmp_path / "t.json", T.kineto_doc(T.kineto_gemm_events(3, kernel_name=name, annotation=name)))
    t0 = time.perf_counter()
    r = run_cli("diagnose", "--json", str(path))
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - t0 < 20


# ------------------------------------------------------------------------ 5. odd types and values

FAKE_NSYS = """#!/bin/sh
# writes a partial export, then sleeps: a timeout of nan/inf used to crash here
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift 2;; *) shift;; esac; done
printf 'partial' > "$out"
sleep 2
cp "$FAKE_NSYS_SOURCE" "$out"
"""


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_nsys_timeout_nan_and_inf_are_one_line_errors(tmp_path, monkeypatch, value):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nsys").write_text(FAKE_NSYS)
    (bindir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_NSYS_SOURCE", str(T.write_nsys(tmp_path / "src.sqlite", n=2)))
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(nsys_rep.MAGIC + b" 2025@3@1@1-x" + os.urandom(256))
    cache = tmp_path / "cache"
    r = run_cli("summary", "--cache-dir", str(cache), str(report), env={"ADVISOR_NSYS_TIMEOUT": value})
    one_line_error(r, "ADVISOR_NSYS_TIMEOUT", "finite")
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file()]


def test_output_names_are_shell_quoted_in_next_lines(tmp_path):
    import shlex

    out = tmp_path / "v\n$(touch pwned) `id`;x.py"
    r = run_cli("generate", "dp", "--shape", "64x64x64", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.is_file()
    lines = r.stdout.splitlines()
    assert len(lines) == 4, lines  # the newline in the name added no line
    (nxt,) = [ln for ln in lines if ln.startswith("next: ")]
    # pasted into bash, the command names the file and runs nothing else
    import subprocess

    argv = subprocess.run(["bash", "-c", "printf '%s\\0' " + nxt[len("next: python "):].split("   ")[0]],
                          capture_output=True, cwd=tmp_path).stdout.split(b"\0")[:-1]
    assert argv == [os.fsencode(out), b"--check"]
    assert not (tmp_path / "pwned").exists()
    plain = tmp_path / "plain name.py"
    r = run_cli("generate", "dp", "--shape", "64x64x64", "-o", str(plain))
    assert f"next: python {shlex.quote(str(plain))} --check" in r.stdout


def test_huge_names_are_cut_in_report_json(tmp_path):
    name = "gemm_" + "x" * (8 << 20)  # 8 MiB names on every launch and annotation
    path = T.write_kineto(tmp_path / "t.json", T.kineto_doc(T.kineto_gemm_events(3, kernel_name=name, annotation=name)))
    out = tmp_path / "out"
    r = run_cli("diagnose", "--json", "--out", str(out), str(path))
    assert r.exit_code == 0, r.output[:300]
    report = (out / "report.json").read_text()
    assert len(report) < 1 << 20 and len(r.stdout) < 1 << 20
    kernels = {f["kernel"] for f in json.loads(report)["findings"]}
    assert kernels == {name[:8192] + f"\u2026[truncated: {len(name):,} characters]"}
    s = run_cli("summary", "--json", str(path))
    assert s.exit_code == 0 and len(s.stdout) < 1 << 20


def tiny_kernel_export(path: Path, strings: list | None) -> Path:
    """400 tiny back-to-back kernels (a launch_overhead finding) whose names are missing:
    no StringIds table (strings None) or ids that point nowhere."""
    tables = T.nsys_tables(0)
    kernels = [T.nsys_kernel(1_000_000 + 3000 * i, 2000, 1, 2, i + 1, gridX=1, gridY=1) for i in range(400)]
    tables["CUPTI_ACTIVITY_KIND_KERNEL"] = (T.KERNEL_DECLS, kernels)
    if strings is None:
        del tables["StringIds"]
    else:
        tables["StringIds"] = (tables["StringIds"][0], strings)
    return T.write_nsys(path, tables)


@pytest.mark.parametrize("strings", [None, [], [(99, "elsewhere")]], ids=["no-StringIds", "empty", "dangling"])
def test_export_without_kernel_names_diagnoses(tmp_path, strings):
    path = tiny_kernel_export(tmp_path / "t.sqlite", strings)
    r = run_cli("diagnose", "--json", str(path))
    assert r.exit_code == 0, r.output[-500:]
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["symptom"] == "launch_overhead"]
    assert f["launches"] == 400 and f["evidence"]["kernel_names"] == 1
    assert f["kernel"] == "(kernel name not in the trace)"
    md = run_cli("diagnose", str(path))
    assert md.exit_code == 0 and "launch_overhead" in md.stdout


# ------------------------------------------------------------------ 6. no side effects on reading


def test_live_wal_database_is_read_without_touching_its_files(tmp_path):
    """A WAL database with writes in its log and a writer still connected: the reader sees
    the logged rows, and the -wal and -shm beside it are byte for byte as they were (before:
    reading wrote read marks into -shm)."""
    import hashlib
    import sqlite3

    path = T.write_nsys(tmp_path / "w.sqlite", n=4)
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")
        writer.commit()
        beside = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
                  for p in tmp_path.iterdir()}
        assert {"w.sqlite-wal", "w.sqlite-shm"} <= set(beside)
        assert len(load_trace(path).kernels) == 8  # the 4 rows only in the log are read too
        after = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
                 for p in tmp_path.iterdir()}
        assert after == beside
    finally:
        writer.close()


@pytest.mark.parametrize("journal", ["DELETE", "MEMORY"])  # MEMORY: a lock and no -journal file
def test_database_locked_by_a_writer_fails_fast_and_says_so(tmp_path, journal):
    import sqlite3
    import time

    path = T.write_nsys(tmp_path / "l.sqlite", n=4)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute(f"PRAGMA journal_mode={journal}")
        writer.execute("BEGIN EXCLUSIVE")
        writer.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
        t0 = time.monotonic()
        one_line_error(run_cli("summary", str(path)), "l.sqlite", "being written")
        assert time.monotonic() - t0 < 10  # was 20 s, then a silent torn read
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert len(load_trace(path).kernels) == 4


def test_unfinished_journal_is_an_error_not_a_torn_read(tmp_path):
    path = T.write_nsys(tmp_path / "j.sqlite", n=4)
    (tmp_path / "j.sqlite-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + os.urandom(504))
    one_line_error(run_cli("summary", str(path)), "j.sqlite", "unfinished transaction")


# ------------------------------------------------------- 7. no option that runs code from the env


@pytest.mark.parametrize("var", ["ADVISOR_DIAGNOSE_RUN", "ADVISOR_DIAGNOSE_RUN_VARIANTS"])
def test_run_is_never_taken_from_the_environment(tmp_path, monkeypatch, var):
    import advisor.run.loop

    def must_not_run(*a, **k):
        raise AssertionError("--run was turned on by the environment")

    monkeypatch.setattr(advisor.run.loop, "loop_findings", must_not_run)
    monkeypatch.chdir(tmp_path)
    trace = T.write_kineto(tmp_path / "t.json")
    r = run_cli("diagnose", "--json", str(trace), env={var: "1"})
    assert r.exit_code == 0, r.output[-500:]
    assert json.loads(r.stdout)["findings"]  # a diagnosis with GEMM findings that --run would run
    assert not (tmp_path / "advisor-run").exists()
    # typed on the command line it still works
    r = run_cli("diagnose", "--json", "--run", str(trace))
    assert isinstance(r.exception, AssertionError)


@pytest.mark.parametrize("var", ["ADVISOR_DIAGNOSE_COUNTERS", "ADVISOR_BENCH_COUNTERS"])
def test_counters_is_never_taken_from_the_environment(tmp_path, var):
    ctx_cmd = "diagnose" if "DIAGNOSE" in var else "bench"
    opt = next(p for p in cli.commands[ctx_cmd].params if p.name == "counters")
    assert opt.allow_from_autoenv is False
    trace = T.write_kineto(tmp_path / "t.json")
    if ctx_cmd == "diagnose":  # from the environment it is off, so no "--counters needs --run" error
        r = run_cli("diagnose", "--json", str(trace), env={var: "1"})
        assert r.exit_code == 0, r.output[-300:]


# ------------------------------------------------------------------------------------ 8. scale


def _frames(trace) -> dict:
    return {n: getattr(trace, n).reset_index(drop=True) for n in ("kernels", "runtime", "memcpy", "cpu_ops", "nvtx")}


def test_kineto_is_streamed_in_bounded_memory(tmp_path, monkeypatch):
    """A Kineto file is decoded event by event and turned into frames in batches: the traced
    peak stays under 3x the file's size (json.loads of this whole 7 MB document alone peaks
    at 37 MB, over 5x; the frames of these small events take ~2x)."""
    from advisor.traces import _jsonio, kineto

    events = T.kineto_gemm_events(10_000, annotation="step")  # 40k events
    path = T.write_kineto(tmp_path / "big.json", T.kineto_doc(events))
    monkeypatch.setattr(kineto, "_BATCH", 2000)
    # the decoder's chunk in proportion too (4 MB by default, most of this small file at once)
    monkeypatch.setattr(_jsonio, "_CHUNK", 1 << 20)
    tracemalloc.start()
    try:
        trace = load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(trace.kernels) == 10_000 and len(trace.nvtx) == 10_000
    assert peak < 3 * path.stat().st_size, (peak >> 20, path.stat().st_size >> 20)


def rocm_late_launch_doc() -> dict:
    """ROCm-style events: kernels without grid/block, their launching HIP calls (one a
    work-item launch) and copies sized by their call, with every call written after the
    kernels and copies it launched (batches see the calls late)."""
    gpu, host = [], []
    for i in range(1, 9):
        gpu.append({"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 2, "tid": 1, "ts": 100.0 * i, "dur": 5.0,
                    "args": {"device": 2, "stream": 1, "correlation": i}})
        api = "hipExtModuleLaunchKernel" if i % 4 == 0 else "hipLaunchKernel"
        host.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1, "ts": 100.0 * i - 10, "dur": 3.0,
                     "args": {"correlation": i, "grid": [1024, 2, 1], "block": [256, 1, 1], "shared memory": 4096}})
    gpu.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 2, "tid": 1, "ts": 5000.0, "dur": 4.0,
                "args": {"device": 2, "stream": 1, "correlation": 99}})
    host.append({"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyAsync", "pid": 1, "tid": 1, "ts": 4990.0, "dur": 2.0,
                 "args": {"correlation": 99, "size": 65536}})
    return T.kineto_doc(gpu + host, baseTimeNanoseconds=1_700_000_000_000_000_000)


@pytest.mark.parametrize("batch", [1, 3, 1000])
def test_batched_read_equals_whole_read(tmp_path, monkeypatch, batch):
    """Frames read in batches of any size (launch calls after their kernels included) equal
    the frames read at once."""
    import pandas.testing as pdt

    from advisor.traces import kineto

    path = T.write_kineto(tmp_path / "r.json", rocm_late_launch_doc())
    monkeypatch.setattr(kineto, "_BATCH", 10**9)
    whole = load_trace(path)
    monkeypatch.setattr(kineto, "_BATCH", batch)
    batched = load_trace(path)
    k = whole.kernels
    assert k["grid_x"].tolist() == [1024, 1024, 1024, 4, 1024, 1024, 1024, 4]  # work-items -> workgroups at i=4, 8
    assert k["static_smem_bytes"].tolist() == [4096] * 8 and whole.memcpy["bytes"].tolist() == [65536]
    assert int(k["start_ns"].iloc[0]) == 1_700_000_000_000_000_000 + 100_000
    for name, a in _frames(whole).items():
        pdt.assert_frame_equal(a, _frames(batched)[name], check_dtype=False, obj=name)
    assert sorted(whole.meta["notes"]) == sorted(batched.meta["notes"])
