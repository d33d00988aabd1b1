"""Nothing lost or changed: every reader opens the user's trace files read-only, the files are
byte-identical afterwards (content hash and mtime), and whatever advisor writes (decompressed
SQLite copies, nsys exports, reports) goes to the cache directory or --out, never beside the
input: the input directory's listing is the same before and after.

"Opened read-only" is checked from the inside with a Python audit hook, which sees every
`open()`/`os.open()` (path, mode, flags) and every `sqlite3.connect()` (the URI, which must
say mode=ro) made while the CLI runs in this process, so a reader that opened a file for
writing and happened not to write would still fail here. The hook stays installed for the
process (audit hooks cannot be removed) but records only while a test holds it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracefiles as T
from advisor.cli import cli
from advisor.traces import nsys_rep

_RECORDING: list | None = None
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _hook(event: str, args: tuple) -> None:
    if _RECORDING is None:
        return
    if event == "open":
        path, mode, flags = args
        if isinstance(path, (str, bytes, os.PathLike)):
            _RECORDING.append(("open", os.fsdecode(path), mode, flags))
    elif event == "sqlite3.connect":
        _RECORDING.append(("sqlite3.connect", str(args[0]), None, None))


sys.addaudithook(_hook)


class Recorder:
    """Collects audit events between start() and the end of the test."""

    def __init__(self) -> None:
        self.records: list = []

    def start(self) -> list:
        global _RECORDING
        _RECORDING = self.records
        return self.records


@pytest.fixture
def opens():
    global _RECORDING
    rec = Recorder()
    try:
        yield rec
    finally:
        _RECORDING = None


def snapshot(directory: Path) -> dict[str, tuple]:
    """name -> (sha256, size, mtime_ns, mode) of everything in `directory` (recursively)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        out[str(p.relative_to(directory))] = (digest, st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def assert_read_only(records: list, user_dir: Path) -> int:
    """Every open of a file under `user_dir` was read-only; returns how many there were."""
    root = os.path.realpath(user_dir)
    seen = 0
    for event, path, mode, flags in records:
        if event == "sqlite3.connect":
            if root in path or str(user_dir) in path:
                seen += 1
                assert "mode=ro" in path, f"SQLite opened without mode=ro: {path}"
            continue
        if not os.path.realpath(path).startswith(root + os.sep):
            continue
        seen += 1
        if mode is not None:
            assert not set(str(mode)) & set("wax+"), f"{path} opened with mode {mode!r}"
        if isinstance(flags, int):
            assert not flags & _WRITE_FLAGS, f"{path} opened with write flags {flags:#o}"
    return seen


FAKE_NSYS = r"""#!/bin/sh
# Stand-in for `nsys export`: copies $FAKE_NSYS_SOURCE to the -o path.
out=""
while [ $# -gt 1 ]; do
  if [ "$1" = "-o" ]; then out="$2"; fi
  shift
done
cp "$FAKE_NSYS_SOURCE" "$out"
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A user directory, an XDG cache and a fake nsys on PATH that 'exports' a known file."""
    user = tmp_path / "user data"  # a space: paths must survive URIs and shell quoting
    user.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nsys").write_text(FAKE_NSYS)
    (bindir / "nsys").chmod(0o755)
    monkeypatch.setenv("FAKE_NSYS_SOURCE", str(T.write_nsys(tmp_path / "exported.sqlite")))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setattr(nsys_rep, "STANDARD_LOCATIONS", ())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return user, tmp_path / "xdg" / "advisor"


def _wal_export(path: Path) -> Path:
    T.write_nsys(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _rocprof_csv_with_agent_info(user: Path) -> Path:
    T.write_csv(user / "run_agent_info.csv", [{"Node_Id": 2, "Logical_Node_Id": 2, "Agent_Type": "GPU", "Cu_Count": 304,
                                               "Wave_Front_Size": 64, "Name": "gfx942", "Product_Name": "AMD Instinct MI300X"}],
                header=["Node_Id", "Logical_Node_Id", "Agent_Type", "Cu_Count", "Wave_Front_Size", "Name", "Product_Name"])
    return T.write_csv(user / "run_kernel_trace.csv", [T.v3_row(i) for i in range(3)])


# (id, builder(user dir) -> file, expected format, kernels, what the cache must hold afterwards)
INPUTS = [
    ("nsys-sqlite", lambda u: T.write_nsys(u / "run #1.sqlite"), "nsys-sqlite", 6, None),
    ("nsys-sqlite-wal", lambda u: _wal_export(u / "wal.sqlite"), "nsys-sqlite", 6, None),
    ("nsys-sqlite-gz", lambda u: _write(u / "run.sqlite.gz", gzip.compress(T.write_nsys(u.parent / "plain.sqlite").read_bytes())),
     "nsys-sqlite", 6, "run-*.sqlite"),
    ("nsys-rep", lambda u: _write(u / "run.nsys-rep", nsys_rep.MAGIC + b" 2025@3@1@0\n" + bytes(range(256)) * 8),
     "nsys-rep", 6, "run-*.sqlite"),
    ("kineto-json", lambda u: T.write_kineto(u / "rank0.json"), "kineto", 6, None),
    ("kineto-json-gz", lambda u: T.write_kineto(u / "rank0.json.gz", gz=True), "kineto", 6, None),
    ("rocprof-csv", _rocprof_csv_with_agent_info, "rocprof-csv", 3, None),
    ("rocprofv3-json", lambda u: T.write_json(u / "run_results.json", T.rocprofv3_doc()), "rocprofv3-json", 3, None),
    ("rocpd", lambda u: T.write_rocpd(u / "run.db"), "rocpd", 3, None),
]


@pytest.mark.parametrize("use_cache_dir", [False, True], ids=["default-cache", "cache-dir"])
@pytest.mark.parametrize("case_id, builder, fmt, n_kernels, cached", INPUTS, ids=[c[0] for c in INPUTS])
def test_inputs_untouched_and_outputs_elsewhere(env, tmp_path, opens, case_id, builder, fmt, n_kernels, cached, use_cache_dir):
    user, default_cache = env
    path = builder(user)
    (user.parent / "plain.sqlite").unlink(missing_ok=True)
    before = snapshot(user)
    records = opens.start()
    cache = tmp_path / "my cache" if use_cache_dir else default_cache
    extra = ["--cache-dir", str(cache)] if use_cache_dir else []
    out = tmp_path / "report out"

    runner = CliRunner()
    r = runner.invoke(cli, ["summary", "--json", *extra, str(path)])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["format"] == fmt and info["kernels"]["count"] == n_kernels
    r = runner.invoke(cli, ["diagnose", "--json", *extra, "--out", str(out), str(path)])
    assert r.exit_code == 0, r.output

    assert snapshot(user) == before  # same names, bytes, mtimes and modes: nothing added or changed
    assert assert_read_only(records, user) >= 1  # the hook did see the reads
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"] or \
        sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", "waves.png"]
    if cached:
        made = sorted(cache.glob(cached))
        assert len(made) == 1, sorted(cache.glob("*"))
        assert made[0].read_bytes()[:16] == b"SQLite format 3\x00"
    else:
        assert not cache.exists() or not any(cache.iterdir())
    # the reports name the file the user gave, never the cache copy or a path
    report = json.loads((out / "report.json").read_text())
    assert report["trace"]["sources"] == [path.name]
    assert str(cache) not in (out / "report.md").read_text() and str(user) not in (out / "report.md").read_text()


def test_several_files_untouched(env, tmp_path, opens):
    user, _ = env
    files = [T.write_kineto(user / "rank0.json", T.kineto_doc(distributedInfo={"rank": 0})), T.write_nsys(user / "rank1.sqlite")]
    before = snapshot(user)
    records = opens.start()
    r = CliRunner().invoke(cli, ["diagnose", "--json", *map(str, files)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["trace"]["ranks"] == [0, 1]
    assert snapshot(user) == before
    assert assert_read_only(records, user) >= 2


def test_failed_read_leaves_nothing_either(env, tmp_path, opens):
    """A corrupt file is refused without a side file (SQLite journal, partial export)."""
    user, cache = env
    good = T.write_nsys(user / "x.sqlite").read_bytes()
    bad = user / "bad.sqlite"
    bad.write_bytes(good[:100] + b"\xa5" * (len(good) - 100))
    (user / "x.sqlite").unlink()
    gz = user / "cut.sqlite.gz"
    gz.write_bytes(gzip.compress(good)[:300])
    before = snapshot(user)
    records = opens.start()
    for path in (bad, gz):
        r = CliRunner().invoke(cli, ["summary", str(path)])
        assert r.exit_code == 2, r.output
    assert snapshot(user) == before
    assert assert_read_only(records, user) >= 2
    assert not cache.exists() or not [p for p in cache.iterdir() if p.suffix != ".sqlite" or "cut" in p.name]
