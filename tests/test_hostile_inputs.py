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
