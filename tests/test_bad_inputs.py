"""Bad input: every malformed trace gives one line on stderr and exit code 2, or a correct
result when the data is usable; the readers never raise anything but TraceError.

The corpus below is generated here (tmp_path), one case per way a profiler file goes wrong in
the field: empty, truncated or corrupt JSON/gzip/CSV/SQLite, wrong tables or columns,
impossible numbers (end < start, values past 2**63, NaN, 400-digit integers), no kernels,
wrong extensions, directories, FIFOs, unreadable files, several formats in one call, names
and contents that are not UTF-8. Each case states its outcome: `Err(words in the message)` or
`Ok(check of the summary JSON)`, and goes through the CLI (`summary --json`, `diagnose
--json` and the markdown report).

The fuzzers then feed the readers random bytes, byte-mutated valid files of each format and
structurally random documents (hypothesis), asserting only "TraceError or a trace that
summary, diagnose and the report handle". They are quick by default; ADVISOR_FUZZ=1 runs the
long variant (many more examples, no fixed seed).
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracefiles as T
from advisor.cli import cli
from advisor.diagnose.diagnosis import diagnose
from advisor.errors import TraceError
from advisor.report.render import render
from advisor.report.summary import summarize
from advisor.traces import load_trace, nsys_rep


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Caches (gunzipped SQLite, nsys exports) go to a per-test dir, and no nsys is found."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(nsys_rep, "STANDARD_LOCATIONS", ())


def run_cli(*args: str):
    return CliRunner().invoke(cli, list(args))


def assert_one_line_error(result, needles=()) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert err.startswith("advisor: error: ") and "Traceback" not in result.output
    assert "\x1b" not in err, "raw escape sequence on the terminal"
    for n in needles:
        assert n in err, (n, err)
    return err


def summary_json(paths: list[Path]) -> dict:
    r = run_cli("summary", "--json", *map(str, paths))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------- the corpus


@dataclass
class Err:
    needles: tuple[str, ...]


@dataclass
class Ok:
    check: Callable[[dict], None]


def kernels(n: int, notes: tuple[str, ...] = ()) -> Ok:
    """Usable data: `n` kernels, and each of `notes` said in the notes."""

    def check(info: dict) -> None:
        assert info["kernels"]["count"] == n, info["kernels"]
        for note in notes:
            assert any(note in x for x in info["notes"]), (note, info["notes"])

    return Ok(check)


K_EVENT = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 2.0,
           "args": {"device": 0, "stream": 7, "correlation": 1, "grid": [4, 1, 1], "block": [128, 1, 1]}}


def kev(**kw) -> dict:
    return {**K_EVENT, **kw}


def kdoc(*events: dict, **top) -> bytes:
    return json.dumps(T.kineto_doc(list(events), **top)).encode()


def sqlite_bytes(tmp: Path, **kw) -> bytes:
    path = T.write_nsys(tmp / "_src.sqlite", **kw)
    data = path.read_bytes()
    path.unlink()
    return data


def nsys_with_kernel_rows(tmp: Path, name: str, rows: list[tuple], decls=("start INTEGER", "end INTEGER", "deviceId INTEGER")) -> Path:
    """An nsys export whose kernel table has `decls` and `rows`; a row given as a string is
    inserted as SQL literals (how 2**64 - 1 gets in: SQLite stores it as a REAL)."""
    tables = T.nsys_tables(n=0)
    tables["CUPTI_ACTIVITY_KIND_KERNEL"] = (list(decls), [r for r in rows if not isinstance(r, str)])
    path = T.write_nsys(tmp / name, tables)
    conn = sqlite3.connect(path)
    for r in rows:
        if isinstance(r, str):
            conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({r})")
    conn.commit()
    conn.close()
    return path


def write(tmp: Path, name: str, data: bytes | str) -> Path:
    path = tmp / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _padded_nsys(tmp: Path) -> bytes:
    """A valid export spanning several pages (filler table), so truncation cuts real data."""
    tables = T.nsys_tables()
    tables["filler"] = (["a TEXT"], [("x" * 2000,) for _ in range(40)])
    return T.write_nsys(tmp / "_padded.sqlite", tables).read_bytes()


def _schema_not_utf8(tmp: Path) -> Path:
    """A byte that is not UTF-8 inside the schema's SQL: SQLite's error message quotes it and
    Python's sqlite3 raised UnicodeDecodeError while decoding the message (found by fuzzing)."""
    data = sqlite_bytes(tmp, n=3)
    old = b'CREATE TABLE "CUPTI_ACTIVITY_KIND_KERNEL" (start INTEGER NOT NULL, '
    new = b'CREATE TABLE "CUPTI_ACTIVITY_KIND_KERNEL" \x80(start INTEGER NOT NULL,'
    assert len(old) == len(new) and data.count(old) == 1
    return write(tmp, "a.sqlite", data.replace(old, new))


def _fifo(tmp: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    path = tmp / "pipe.json"
    os.mkfifo(path)
    return path


def _symlink_loop(tmp: Path) -> Path:
    path = tmp / "loop.json"
    os.symlink(path, path)
    return path


def _nonutf8_name(tmp: Path) -> Path:
    name = os.fsdecode(b"trace-\xff\xfe-rank0.json")  # surrogate-escaped: not valid UTF-8
    try:
        return T.write_kineto(tmp / name)
    except (OSError, UnicodeEncodeError):
        pytest.skip("the file system refuses names that are not UTF-8")


def _mixed(tmp: Path) -> list[Path]:
    k = T.write_kineto(tmp / "rank0.json", T.kineto_doc(distributedInfo={"rank": 0, "world_size": 2}))
    return [k, T.write_nsys(tmp / "rank1.sqlite", n=4)]


def _mixed_check(info: dict) -> None:
    assert info["format"] == ["kineto", "nsys-sqlite"] and info["ranks"] == [0, 1]
    assert info["kernels"]["count"] == 6 + 4
    assert {d["rank"] for d in info["devices"]} == {0, 1}


def _truncated_sqlite_gz(tmp: Path) -> Path:
    data = gzip.compress(_padded_nsys(tmp), mtime=0)
    return write(tmp, "run.sqlite.gz", data[: len(data) // 3])


# (id, builder(tmp) -> Path | list[Path], expected outcome)
CASES: list[tuple[str, Callable[[Path], Any], Err | Ok]] = [
    # --- empty and garbage
    ("empty-json", lambda t: write(t, "a.json", b""), Err(("a.json", "empty"))),
    ("whitespace-json", lambda t: write(t, "a.json", b" \n\t\n"), Err(("empty",))),
    ("empty-sqlite", lambda t: write(t, "a.sqlite", b""), Err(("empty",))),
    ("binary-garbage", lambda t: write(t, "a.bin", bytes(range(256)) * 20), Err(("unknown trace format",))),
    ("nul-bytes", lambda t: write(t, "a.json", b"\x00" * 512), Err(("unknown trace format",))),
    # --- JSON
    ("json-truncated", lambda t: write(t, "a.json", kdoc(K_EVENT)[:60]), Err(("truncated or corrupt PyTorch profiler JSON",))),
    ("json-list", lambda t: write(t, "a.json", json.dumps([K_EVENT])), Err(("unknown trace format",))),
    ("json-no-traceEvents", lambda t: write(t, "a.json", json.dumps({"schemaVersion": 1, "deviceProperties": []})),
     Err(("without a traceEvents list",))),
    ("json-traceEvents-object", lambda t: write(t, "a.json", json.dumps({"traceEvents": {"0": K_EVENT}})),
     Err(("without a traceEvents list",))),
    ("json-events-not-objects", lambda t: write(t, "a.json", json.dumps({"traceEvents": ["x", 1, None, [K_EVENT]]})),
     Err(("no GPU kernel activity", "no PyTorch profiler events"))),
    ("json-deep-nesting", lambda t: write(t, "a.json", '{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}"),
     Err(("corrupt PyTorch profiler JSON",))),
    ("json-nan-strings", lambda t: write(t, "a.json", kdoc(kev(ts="NaN", dur="nan"), kev(ts="inf"))),
     Err(("no GPU kernel activity", "without a valid ts/dur"))),
    ("json-nan-literals", lambda t: write(t, "a.json", '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", '
                                                        '"ts": NaN, "dur": Infinity}]}'),
     Err(("no GPU kernel activity",))),
    ("json-negative-duration", lambda t: write(t, "a.json", kdoc(kev(dur=-5.0))), Err(("without a valid ts/dur",))),
    ("json-times-past-int64", lambda t: write(t, "a.json", kdoc(kev(ts=1e300), kev(dur=2.0**70), kev(ts=1e16), kev(ts=12.0))),
     kernels(1, ("3 kernel event(s) without a valid ts/dur",))),
    ("json-400-digit-integer", lambda t: write(t, "a.json", '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", '
                                                             '"ts": ' + "9" * 400 + ', "dur": 5}, ' + json.dumps(K_EVENT) + "]}"),
     kernels(1, ("without a valid ts/dur",))),
    ("json-huge-args", lambda t: write(t, "a.json", kdoc(kev(args={"grid": [2**70, 1e300, -1], "block": [1e308, "x", None],
                                                                    "registers per thread": 2**64, "device": 2**65,
                                                                    "stream": -(2**70), "correlation": float("inf") if False else 2**80}))),
     kernels(1)),
    ("json-base-time-past-int64", lambda t: write(t, "a.json", kdoc(K_EVENT, baseTimeNanoseconds=2**70)), kernels(1)),
    ("json-rank-infinity", lambda t: write(t, "a.json", '{"traceEvents": [' + json.dumps(K_EVENT) + '], '
                                                         '"distributedInfo": {"rank": Infinity}}'),
     kernels(1, ("distributedInfo.rank is not a rank number",))),
    ("json-junk-metadata", lambda t: write(t, "a.json", kdoc(K_EVENT, deviceProperties={"id": 0}, distributedInfo="x",
                                                            baseTimeNanoseconds="soon")),
     kernels(1)),
    ("json-latin1-name", lambda t: write(t, "a.json", kdoc(K_EVENT).replace(b'"name": "k"', b'"name": "k\xe9\xff"')),
     kernels(1)),
    ("json-cat-list-and-object", lambda t: write(t, "a.json", kdoc(K_EVENT, kev(cat=["kernel"]), kev(cat={"kernel": 1}), kev(cat=7))),
     kernels(1)),
    ("json-world-size-10e30", lambda t: write(t, "a.json", kdoc(K_EVENT, distributedInfo={"rank": 0, "world_size": 10**30})),
     kernels(1, ("world_size is not a plausible rank count",))),
    ("json-utf8-bom", lambda t: write(t, "a.json", b"\xef\xbb\xbf" + kdoc(K_EVENT)), kernels(1)),
    ("json-utf16", lambda t: write(t, "a.json", kdoc(K_EVENT).decode().encode("utf-16")), Err(("unknown trace format",))),
    # --- gzip
    ("gzip-truncated", lambda t: write(t, "a.json.gz", gzip.compress(kdoc(K_EVENT))[:25]), Err(("truncated gzip",))),
    ("gzip-header-only", lambda t: write(t, "a.json.gz", b"\x1f\x8b"), Err(("truncated gzip",))),
    ("gzip-corrupt", lambda t: write(t, "a.json.gz", gzip.compress(kdoc(K_EVENT))[:10] + b"\xff" * 64), Err(("corrupt gzip",))),
    ("gzip-cut-mid-stream", lambda t: write(t, "a.json.gz", gzip.compress(kdoc(*[kev(ts=float(i)) for i in range(3000)]))[:5000]),
     Err(("a.json.gz",))),
    ("gzip-of-nothing", lambda t: write(t, "a.json.gz", gzip.compress(b"")), Err(("empty",))),
    ("gzip-of-garbage", lambda t: write(t, "a.json.gz", gzip.compress(bytes(range(256)) * 4)), Err(("unknown trace format",))),
    ("sqlite-gz-truncated", _truncated_sqlite_gz, Err(("run.sqlite.gz",))),
    # --- SQLite
    ("sqlite-header-only", lambda t: write(t, "a.sqlite", _padded_nsys(t)[:100]), Err(("a.sqlite",))),
    ("sqlite-truncated", lambda t: write(t, "a.sqlite", (lambda d: d[: len(d) // 2])(_padded_nsys(t))), Err(("truncated",))),
    ("sqlite-corrupt-pages", lambda t: write(t, "a.sqlite", (lambda d: d[:100] + bytes(range(256)) * ((len(d) - 100) // 256)
                                                           + d[100 + 256 * ((len(d) - 100) // 256):])(_padded_nsys(t))),
     Err(("a.sqlite",))),
    ("sqlite-schema-not-utf8", lambda t: _schema_not_utf8(t), Err(("a.sqlite", "corrupt SQLite file"))),
    ("sqlite-unrelated-tables", lambda t: T.write_db(t / "a.sqlite", {"users": (["name TEXT"], [("x",)])}),
     Err(("unknown trace format",))),
    ("sqlite-no-tables", lambda t: T.write_db(t / "a.sqlite", {}), Err(("empty",))),
    ("nsys-kernel-table-without-start-end", lambda t: nsys_with_kernel_rows(t, "a.sqlite", [(0, 4)], ("deviceId INTEGER", "gridX INTEGER")),
     Err(("CUPTI_ACTIVITY_KIND_KERNEL has no start/end columns",))),
    ("nsys-zero-kernels", lambda t: T.write_nsys(t / "a.sqlite", n=0), Err(("no GPU kernel activity", "table is empty"))),
    ("nsys-end-before-start", lambda t: nsys_with_kernel_rows(t, "a.sqlite", [(100, 50, 0), (7, 6, 0)]),
     Err(("none of the 2 rows", "valid start/end"))),
    ("nsys-values-past-int64", lambda t: nsys_with_kernel_rows(
        t, "a.sqlite", [(-(2**63), 2**63 - 1, 0), "1, 18446744073709551615, 0", (1e300, 2e300, 0), (1000, 3000, 0)]),
     kernels(1, ("3 kernels without a valid start/end",))),
    ("nsys-text-and-blob-cells", lambda t: nsys_with_kernel_rows(
        t, "a.sqlite", [("a", "b", "c", b"\xff", "zz"), (1.5, 2.5, 0.5, 1e300, 3.3), (10, 20, 0, 4, None)],
        ("start", "end", "deviceId", "gridX", "demangledName")),
     kernels(1, ("2 kernels without a valid start/end",))),
    ("nsys-blob-names-and-nul", lambda t: T.write_nsys(t / "a.sqlite", _blob_strings(T.nsys_tables())), kernels(6)),
    ("nsys-junk-device-table", lambda t: T.write_nsys(t / "a.sqlite", _junk_gpu(T.nsys_tables())), kernels(6)),
    ("nsys-wal-mode", lambda t: _wal(T.write_nsys(t / "a.sqlite")), kernels(6)),
    # --- CSV
    ("csv-header-only", lambda t: T.write_csv(t / "a_kernel_trace.csv", []), Err(("no GPU kernel activity",))),
    ("csv-unterminated-quote", lambda t: write(t, "a_kernel_trace.csv", 'Kind,Agent_Id,Kernel_Name,Start_Timestamp,End_Timestamp\n'
                                                                       'KERNEL_DISPATCH,2,"gemm,1,2\n'),
     Err(("corrupt or truncated CSV",))),
    ("csv-end-before-start", lambda t: T.write_csv(t / "a_kernel_trace.csv", [T.v3_row(0, start=100, end=50)]),
     Err(("without valid start/end timestamps",))),
    ("csv-values-past-int64", lambda t: T.write_csv(t / "a_kernel_trace.csv", [
        T.v3_row(0, start=1, end="99999999999999999999999"), T.v3_row(1, start="9223372036854775808", end="9223372036854775809"),
        T.v3_row(2, start="", end=""), T.v3_row(3, Grid_Size_X="1e400", Workgroup_Size_X="nan"), T.v3_row(4)]),
     kernels(2, ("3 row(s) without valid start/end",))),
    ("csv-nan-and-inf-fields", lambda t: T.write_csv(t / "a_kernel_trace.csv", [
        T.v3_row(0, Grid_Size_X="inf", Workgroup_Size_X="0", VGPR_Count="NaN", Agent_Id="x"), T.v3_row(1)]),
     kernels(2)),
    ("csv-latin1-bytes", lambda t: write(t, "a_kernel_trace.csv", T.write_csv(t / "_x.csv", [T.v3_row(0)]).read_bytes()
                                          .replace(b"gemm", b"g\xe9\xffmm")), kernels(1)),
    # --- wrong extensions (content decides)
    ("kineto-named-sqlite", lambda t: T.write_kineto(t / "trace.sqlite"), kernels(6)),
    ("kineto-named-nsys-rep", lambda t: T.write_kineto(t / "trace.nsys-rep"), kernels(6)),
    ("csv-named-json", lambda t: T.write_csv(t / "trace.json", [T.v3_row(0), T.v3_row(1)]), kernels(2)),
    ("sqlite-named-json", lambda t: T.write_nsys(t / "trace.json"), kernels(6)),
    ("gzip-kineto-named-csv", lambda t: T.write_kineto(t / "trace.csv", gz=True), kernels(6)),
    ("garbage-named-nsys-rep", lambda t: write(t, "run.nsys-rep", bytes(range(200, 256)) * 8),
     Err(("needs the Nsight Systems CLI", "nsys export --type sqlite"))),
    # --- other formats with junk in them
    ("rocprofv3-json-junk-types", lambda t: T.write_json(t / "a_results.json", _junk_rocprofv3()), Err(("no GPU kernel activity",))),
    ("rocprofv3-json-ids-as-lists", lambda t: T.write_json(t / "a_results.json", _list_ids_rocprofv3()), kernels(3)),
    ("rocpd-junk-cells", lambda t: _junk_rocpd(T.write_rocpd(t / "a.db")), kernels(3)),
    # --- paths that are not trace files
    ("directory", lambda t: (t / "adir").mkdir() or t / "adir", Err(("is a directory",))),
    ("missing-file", lambda t: t / "missing.json", Err(("missing.json", "no such file"))),
    ("fifo", _fifo, Err(("not a regular file",))),
    ("symlink-loop", _symlink_loop, Err(("loop.json",))),
    # --- names
    ("non-utf8-file-name", _nonutf8_name, kernels(6)),
    ("control-chars-in-name", lambda t: write(t, "bad\x1b[31m\u202ename\n.json", b""), Err(("empty", "\\x1b[31m", "\\u202e"))),
    # --- several files in one call
    ("kineto-and-nsys-together", _mixed, Ok(_mixed_check)),
    ("good-and-corrupt-together", lambda t: [T.write_kineto(t / "good.json"), write(t, "bad.json", kdoc(K_EVENT)[:50])],
     Err(("bad.json", "truncated"))),
    ("same-file-twice", lambda t: [T.write_kineto(t / "a.json")] * 2, Err(("a.json", "given twice"))),
]


def _blob_strings(tables: dict) -> dict:
    """StringIds values that are BLOBs with invalid UTF-8, and a name ending in NUL."""
    decls, _ = tables["StringIds"]
    tables["StringIds"] = (["id INTEGER PRIMARY KEY", "value"], [(1, b"\xffgemm\xfe"), (2, "gemm_kernel\x00"), (3, b"cudaLaunchKernel")])
    return tables


def _junk_gpu(tables: dict) -> dict:
    gpu = dict(T.H100_GPU, smCount="many", computeMajor=1e300, maxWarpsPerSm=-1, name=b"\xff\x00GPU")
    tables["TARGET_INFO_GPU"] = (T.GPU_DECLS, [gpu, dict(T.H100_GPU, id="zero", vmId=1)])
    tables["ENUM_NSYS_EVENT_TYPE"] = (["id", "name"], [("x", "NvtxPushPopRange"), (None, "NvtxMark")])
    tables["ENUM_CUDA_MEMCPY_OPER"] = (["id", "name"], [("y", "HTOD")])
    return tables


def _wal(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()  # a clean close checkpoints and removes -wal/-shm; the file stays in WAL mode
    return path


def _junk_rocprofv3() -> dict:
    doc = T.rocprofv3_doc()
    proc = doc["rocprofiler-sdk-tool"][0]
    proc["agents"] = "x"
    proc["kernel_symbols"] = [1, 2]
    proc["strings"] = "x"
    proc["buffer_records"] = {"kernel_dispatch": [{"start_timestamp": "a", "end_timestamp": [], "dispatch_info": {"kernel_id": [1]}}],
                              "hip_api": 5, "memory_copy": {"a": 1}, "marker_api": [None]}
    return doc


def _list_ids_rocprofv3() -> dict:
    doc = T.rocprofv3_doc()
    proc = doc["rocprofiler-sdk-tool"][0]
    proc["agents"].append({"id": [9], "type": 2, "gpu_index": float("inf") if False else 1e300, "cu_count": float("nan") if False else "x"})
    for r in proc["buffer_records"]["kernel_dispatch"]:
        r["correlation_id"] = {"internal": [1]}
        r["stream_id"] = {"handle": {"x": 1}}
    proc["buffer_records"]["hip_api"] = [{"kind": [0], "operation": -1, "start_timestamp": 1, "end_timestamp": 2}]
    proc["buffer_records"]["marker_api"] = [{"correlation_id": {"internal": [1]}}]
    proc["strings"] = {"buffer_records": [{"operations": {"0": "x"}}], "marker_api": [{"key": [1], "value": {"a": 1}}]}
    return doc


def _junk_rocpd(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO rocpd_info_agent VALUES (2, 'GPU', 'x', x'ff', 5, '[1]')")
    conn.execute("INSERT INTO rocpd_kernel_dispatch VALUES (10, 2, 7, 3, 5, 1, 'a', x'ff', 'c', 1e300, 0, 0, 99999999999999999999, -1, 1)")
    conn.commit()
    conn.close()
    return path


def build(builder, tmp: Path) -> list[Path]:
    out = builder(tmp)
    return list(out) if isinstance(out, list) else [out]


def test_corpus_is_large_enough():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)
    assert sum(isinstance(c[2], Err) for c in CASES) >= 30


@pytest.mark.parametrize("case_id, builder, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_through_the_cli(tmp_path, case_id, builder, expected):
    inputs = tmp_path / "in"
    inputs.mkdir()
    paths = [str(p) for p in build(builder, inputs)]
    commands = (["summary", "--json"], ["diagnose", "--json"], ["diagnose"])
    if isinstance(expected, Err):
        for cmd in commands:
            assert_one_line_error(run_cli(*cmd, *paths), expected.needles)
        return
    info = summary_json([Path(p) for p in paths])
    expected.check(info)
    results = [run_cli(*cmd, *paths) for cmd in commands[1:]]
    for r in results:
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        assert r.exit_code == 0, r.output
    assert json.loads(results[0].stdout)["trace"]["kernels"] == info["kernels"]["count"]
    assert results[1].stdout.startswith("# advisor diagnosis")


def test_unreadable_file(tmp_path):
    path = T.write_kineto(tmp_path / "secret.json")
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: a mode-000 file is still readable")
        assert_one_line_error(run_cli("summary", str(path)), ("secret.json", "permission denied"))
        assert_one_line_error(run_cli("diagnose", str(path)), ("permission denied",))
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_values_past_int64_are_dropped_not_wrapped(tmp_path):
    """The one usable row of the past-int64 cases keeps its exact times; nothing wrapped
    around into a negative or tiny duration."""
    t = load_trace(nsys_with_kernel_rows(tmp_path, "a.sqlite", ["1, 18446744073709551615, 0", (1000, 3000, 0)]))
    assert t.kernels[["start_ns", "end_ns", "dur_ns"]].values.tolist() == [[1000, 3000, 2000]]
    k = load_trace(write(tmp_path, "a.json", kdoc(kev(ts=1e16), kev(ts=12.5, dur=2.25)))).kernels
    assert k[["start_ns", "dur_ns"]].values.tolist() == [[12500, 2250]]


def test_impossible_launch_values_become_unknown(tmp_path):
    """grid/block dimensions of zero, negative or past CUDA's limits are not used as numbers
    (they would make waves and occupancy nonsense); valid dimensions stay."""
    events = [kev(ts=float(i), args={**K_EVENT["args"], "grid": g, "block": b, "registers per thread": r})
              for i, (g, b, r) in enumerate([([0, 1, 1], [128, 1, 1], 32), ([4, -2, 1], [2**31, 1, 1], -1), ([8, 2, 1], [64, 2, 1], 40)])]
    t = load_trace(write(tmp_path, "a.json", kdoc(*events)))
    k = t.kernels
    assert k["grid_blocks"].tolist()[2] == 16 and k["block_threads"].tolist()[2] == 128
    assert k["grid_blocks"].isna().tolist() == [True, True, False]
    assert k["block_threads"].isna().tolist() == [False, True, False]
    assert k["registers_per_thread"].isna().tolist() == [False, True, False]
    assert any("2 kernel launch(es) had impossible" in n for n in t.meta["notes"])


def test_non_utf8_names_are_escaped_in_reports(tmp_path):
    path = _nonutf8_name(tmp_path)
    out = tmp_path / "out"
    r = run_cli("diagnose", str(path), "--out", str(out))
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text(encoding="utf-8")  # written as valid UTF-8
    assert "trace-\\udcff\\udcfe-rank0.json" in md and "trace-\\udcff\\udcfe-rank0.json" in r.stdout
    assert json.loads((out / "report.json").read_text(encoding="utf-8"))["trace"]["sources"] == [path.name]


def test_outputs_that_cannot_be_written(tmp_path):
    """--out / -o / --cache-dir under a regular file (NotADirectoryError): one line, exit 2,
    not a traceback from mkdir or write_text."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    trace = str(T.write_kineto(tmp_path / "t.json"))
    gz = tmp_path / "t.sqlite.gz"
    gz.write_bytes(gzip.compress(sqlite_bytes(tmp_path, n=2)))
    for args in (["diagnose", trace, "--out", str(blocker / "out")],
                 ["diagnose", trace, "--json", "--out", str(blocker / "out")],
                 ["generate", "dp", "--shape", "64x64x64", "-o", str(blocker / "v.py")],
                 ["summary", "--cache-dir", str(blocker / "cache"), str(gz)]):
        assert_one_line_error(run_cli(*args), ("a-file",))


def test_truncated_sqlite_gz_leaves_no_partial_copy(tmp_path):
    """The error names the user's file, and the cache holds no half-written copy."""
    cache = tmp_path / "cache"
    path = _truncated_sqlite_gz(tmp_path)
    assert_one_line_error(run_cli("summary", "--cache-dir", str(cache), str(path)), ("run.sqlite.gz", "decompress"))
    assert not cache.exists() or not any(cache.iterdir())


# ---------------------------------------------------------------------------------- fuzzing

FUZZ = os.environ.get("ADVISOR_FUZZ") == "1"
FUZZ_SETTINGS = settings(
    max_examples=1500 if FUZZ else 20,
    deadline=None,
    derandomize=not FUZZ,  # CI runs a fixed set; ADVISOR_FUZZ=1 explores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def exercise(data: bytes, name: str) -> None:
    """Write `data` as `name`, load it; a TraceError is fine, anything else must survive
    summary, diagnosis, the markdown report and JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            trace = load_trace(path, cache_dir=Path(tmp) / "cache")
        except TraceError as exc:
            assert "\n" not in str(exc)
            return
        json.dumps(summarize(trace), default=str)
        d = diagnose(trace)
        render("diagnosis.md.j2", d=d, images={})
        json.dumps(d.to_dict(), default=str)


def mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Apply (position, delete count, insert bytes) edits, positions taken modulo the length."""
    buf = bytearray(data)
    for pos, delete, insert in edits:
        p = pos % (len(buf) + 1)
        buf[p : p + delete] = insert
    return bytes(buf)


EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 8), st.binary(max_size=8)), min_size=1, max_size=6)
NAMES = st.sampled_from(["t.json", "t.json.gz", "t.sqlite", "t_kernel_trace.csv", "t.nsys-rep", "t.db", "t", "t_results.json"])
PREFIXES = st.sampled_from([b"", b"SQLite format 3\x00", b"\x1f\x8b\x08\x00", b'{"traceEvents": [', b"NVIDIA Tegra Profiler Report",
                            b'{"rocprofiler-sdk-tool": [', b"Kind,Agent_Id,Kernel_Name,Start_Timestamp,End_Timestamp\n"])

_KINETO = kdoc(*T.kineto_gemm_events(3))
_CSV_ROWS = [T.v3_row(i) for i in range(4)]
_ROCPROFV3 = json.dumps(T.rocprofv3_doc()).encode()


def _csv_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return T.write_csv(Path(tmp) / "x.csv", _CSV_ROWS).read_bytes()


def _nsys_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return sqlite_bytes(Path(tmp), n=3)


_CSV = _csv_bytes()
_NSYS = _nsys_bytes()


@FUZZ_SETTINGS
@given(prefix=PREFIXES, body=st.binary(max_size=2048), name=NAMES)
def test_fuzz_random_bytes(prefix, body, name):
    exercise(prefix + body, name)


@FUZZ_SETTINGS
@given(edits=EDITS, gz=st.booleans())
def test_fuzz_mutated_kineto(edits, gz):
    data = mutate(_KINETO, edits)
    exercise(gzip.compress(data, mtime=0) if gz else data, "t.json.gz" if gz else "t.json")


@FUZZ_SETTINGS
@given(edits=EDITS)
def test_fuzz_mutated_csv(edits):
    exercise(mutate(_CSV, edits), "t_kernel_trace.csv")


@FUZZ_SETTINGS
@given(edits=EDITS)
def test_fuzz_mutated_rocprofv3_json(edits):
    exercise(mutate(_ROCPROFV3, edits), "t_results.json")


# SQLite: overwrite bytes (the header's fields, then pages of the schema and the tables)
# rather than insert, so the page structure stays and SQLite reaches the damaged cells.
SQLITE_EDITS = st.lists(st.tuples(st.integers(16, len(_NSYS) - 1), st.binary(min_size=1, max_size=8)), min_size=1, max_size=6)


@FUZZ_SETTINGS
@given(edits=SQLITE_EDITS)
def test_fuzz_mutated_sqlite(edits):
    buf = bytearray(_NSYS)
    for pos, new in edits:
        buf[pos : pos + len(new)] = new
    exercise(bytes(buf[: len(_NSYS)]), "t.sqlite")


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12), st.sampled_from(["NaN", "inf", "-1", "1e400", "", "0x10"]),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                           max_leaves=12)
CATS = st.sampled_from(["kernel", "cuda_runtime", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation", "Kernel", "python_function"])
ARG_KEYS = ["grid", "block", "registers per thread", "shared memory", "device", "stream", "correlation", "bytes",
            "memory bandwidth (GB/s)", "Input Dims", "Input type", "size", "kind"]


@st.composite
def kineto_event(draw) -> dict:
    base = {"ph": draw(st.sampled_from(["X", "X", "X", "i", 5])), "cat": draw(CATS), "name": draw(st.one_of(st.text(max_size=20), JSON_VALUES)),
            "pid": draw(JSON_VALUES), "tid": draw(JSON_VALUES), "ts": draw(JSON_VALUES), "dur": draw(JSON_VALUES)}
    args = {k: draw(JSON_VALUES) for k in draw(st.lists(st.sampled_from(ARG_KEYS), max_size=6, unique=True))}
    base["args"] = draw(st.one_of(st.just(args), JSON_VALUES))
    for key in draw(st.lists(st.sampled_from(list(base)), max_size=2, unique=True)):
        del base[key]
    return base


@FUZZ_SETTINGS
@given(events=st.lists(kineto_event(), max_size=12), top=st.dictionaries(
    st.sampled_from(["deviceProperties", "distributedInfo", "baseTimeNanoseconds", "traceName"]), JSON_VALUES, max_size=4))
def test_fuzz_structured_kineto(events, top):
    good = T.kineto_gemm_events(1)  # one usable launch, so diagnosis runs on the junk too
    doc = {"schemaVersion": 1, **top, "traceEvents": good + events}
    exercise(json.dumps(doc).encode(), "t.json")


# Places in a rocprofv3 document where a corrupt or foreign file can hold any JSON value.
ROCPROF_PATHS = [
    ("agents",), ("agents", 0), ("agents", 1, "id"), ("agents", 1, "type"), ("agents", 1, "gpu_index"),
    ("agents", 1, "cu_count"), ("kernel_symbols",), ("kernel_symbols", 0, "kernel_id"),
    ("kernel_symbols", 0, "formatted_kernel_name"), ("kernel_symbols", 0, "group_segment_size"),
    ("buffer_records",), ("buffer_records", "kernel_dispatch"), ("buffer_records", "kernel_dispatch", 0),
    ("buffer_records", "kernel_dispatch", 0, "start_timestamp"), ("buffer_records", "kernel_dispatch", 0, "end_timestamp"),
    ("buffer_records", "kernel_dispatch", 0, "correlation_id"), ("buffer_records", "kernel_dispatch", 0, "dispatch_info"),
    ("buffer_records", "kernel_dispatch", 1, "dispatch_info", "agent_id"),
    ("buffer_records", "kernel_dispatch", 1, "dispatch_info", "kernel_id"),
    ("buffer_records", "kernel_dispatch", 1, "dispatch_info", "grid_size"),
    ("buffer_records", "kernel_dispatch", 1, "dispatch_info", "workgroup_size"),
    ("buffer_records", "hip_api"), ("buffer_records", "memory_copy"), ("buffer_records", "marker_api"),
    ("strings",), ("strings", "buffer_records"), ("strings", "marker_api"),
]


def _set(doc: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


@FUZZ_SETTINGS
@given(edits=st.lists(st.tuples(st.sampled_from(ROCPROF_PATHS), JSON_VALUES), min_size=1, max_size=5))
def test_fuzz_structured_rocprofv3(edits):
    doc = T.rocprofv3_doc()
    proc = doc["rocprofiler-sdk-tool"][0]
    for path, value in edits:
        try:
            _set(proc, path, value)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit replaced the container: that is a test case too
    exercise(json.dumps(doc).encode(), "t_results.json")


SQL_CELLS = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=False),
                      st.text(max_size=8), st.binary(max_size=8))


@FUZZ_SETTINGS
@given(cells=st.lists(st.tuples(st.sampled_from(["start", "end", "deviceId", "streamId", "correlationId", "demangledName",
                                                 "shortName", "gridX", "gridY", "blockX", "registersPerThread",
                                                 "dynamicSharedMemory", "staticSharedMemory"]),
                                st.integers(0, 5), SQL_CELLS), max_size=10),
       strings=st.lists(st.tuples(st.integers(0, 5), st.one_of(st.text(max_size=10), st.binary(max_size=10))), max_size=4),
       gpu=st.dictionaries(st.sampled_from(["id", "smCount", "computeMajor", "computeMinor", "name", "maxWarpsPerSm"]), SQL_CELLS, max_size=3))
def test_fuzz_structured_nsys(cells, strings, gpu):
    """Cells of any SQLite type (huge integers, floats, text, BLOBs, NULL) in the columns the
    nsys reader reads, without NOT NULL constraints, as a hand-edited or foreign file has."""
    tables = T.nsys_tables()
    decls = [d.split()[0] for d in T.KERNEL_DECLS]
    rows = [dict(r) for r in tables["CUPTI_ACTIVITY_KIND_KERNEL"][1]]
    for col, i, value in cells:
        rows[i][col] = value
    tables["CUPTI_ACTIVITY_KIND_KERNEL"] = (decls, rows)
    tables["StringIds"] = (["id", "value"], tables["StringIds"][1] + [(10 + i, v) for i, v in strings])
    tables["TARGET_INFO_GPU"] = ([d.split()[0] for d in T.GPU_DECLS], [dict(T.H100_GPU, **gpu)])
    with tempfile.TemporaryDirectory() as tmp:
        data = T.write_nsys(Path(tmp) / "x.sqlite", tables).read_bytes()
    exercise(data, "t.sqlite")
