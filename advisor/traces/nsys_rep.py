"""Nsight Systems reports (`.nsys-rep`, older `.qdrep`), read through their SQLite export.

The report format is private to Nsight Systems, so the `nsys` CLI converts it:

    nsys export --type sqlite -f true -o <cache>/<stem>-<content hash>.sqlite <report>

and `nsys_sqlite` reads the result. The export goes to a cache directory (the `cache_dir`
argument, else `$XDG_CACHE_HOME/advisor`, else `~/.cache/advisor`), never beside the
user's file, and is reused while the report's content identity (size, mtime, hash of its
head) matches; the cache must be the user's own and not writable by others (`_cache`). nsys is looked up as
`$NSYS`, then on PATH, then in the standard install directories (newest version first).
Without nsys the error says how to make the export elsewhere and pass the .sqlite instead.

Reports start with the bytes "NVIDIA Tegra Profiler Report" (checked on a 2023.2 report;
newer ones continue with the writing build, e.g. "... Report 2026@4@1@191-...", which the
error messages quote because `nsys export` refuses reports newer than itself).
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from ..errors import TraceError
from ..executables import find_executable
from ..model import Trace
from . import _cache, _sqlite, nsys_sqlite

FORMAT = "nsys-rep"
DESCRIPTION = "Nsight Systems report (.nsys-rep, converted with nsys export)"

MAGIC = b"NVIDIA Tegra Profiler Report"
EXTENSIONS = (".nsys-rep", ".qdrep")

# Where nsys lives when it is not on PATH: Nsight Systems installers, the CUDA toolkit, and
# the copy shipped inside Nsight Compute. Globs; the newest match wins.
STANDARD_LOCATIONS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
)

# Seconds one export may take. Exporting a multi-GB report takes minutes; a hung nsys
# should not hang advisor forever. ADVISOR_NSYS_TIMEOUT overrides.
EXPORT_TIMEOUT_S = 900

_REPORT_BUILD = re.compile(rb"Report (\d+)@(\d+)@(\d+)@(\d+)")


def sniff(path: Path, head: bytes) -> bool:
    """The report magic; or a report extension on content that is neither SQLite nor JSON
    (reports whose first bytes differ would still reach nsys, which says what it thinks)."""
    if head.startswith(MAGIC):
        return True
    if Path(path).suffix.lower() not in EXTENSIONS:
        return False
    start = head.lstrip()[:1]
    return not _sqlite.is_sqlite(head) and start not in (b"{", b"[")


def find_nsys() -> str | None:
    """Path of the nsys executable to use, or None. `$NSYS` must be valid when set."""
    return find_executable("nsys", "NSYS", STANDARD_LOCATIONS, TraceError)


def report_build(path: Path) -> str | None:
    """The nsys build that wrote the report ("2026.4.1.191"), when its header says."""
    with open(path, "rb") as fh:
        m = _REPORT_BUILD.search(fh.read(256))
    return ".".join(x.decode() for x in m.groups()) if m else None


def _timeout() -> float:
    raw = os.environ.get("ADVISOR_NSYS_TIMEOUT")
    if not raw:
        return EXPORT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"ADVISOR_NSYS_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:  # nan passed `<= 0`, inf overflowed the wait
        raise TraceError(f"ADVISOR_NSYS_TIMEOUT must be a finite positive number of seconds, got {raw!r}")
    return value


def _how_to_export(path: Path) -> str:
    out = Path(path.name).with_suffix(".sqlite").name
    return f"nsys export --type sqlite -o {shlex.quote(out)} {shlex.quote(path.name)}"


def _last_line(text: bytes | str | None) -> str:
    if not text:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _run(cmd: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    """Run nsys in its own process group so that a timeout ends it and its helpers."""
    posix = hasattr(os, "killpg")
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=posix
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if posix:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            proc.kill()
        proc.communicate()
        raise
    return proc.returncode, stdout, stderr


def _usable_export(path: Path) -> bool:
    """A cached export that opens and has nsys tables (else it is made again)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(100)
        names = _sqlite.table_names(path) if _sqlite.is_sqlite(head) else set()
    except (OSError, TraceError):
        return False
    return nsys_sqlite.is_nsys_schema(names)


def export_sqlite(path: Path, cache_dir: Path | None = None) -> Path:
    """The SQLite export of report `path` in the cache, made by nsys unless already there
    (keyed on the report's content identity, checked before it is reused: see `_cache`)."""
    return _export(path, cache_dir)[0]


def _export(path: Path, cache_dir: Path | None) -> tuple[Path, bool]:
    """(export, whether it came from the cache)."""
    path = Path(path)
    timeout = _timeout()  # a bad value fails before anything is started or written
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)[:80] or "report"
    name = f"{stem}-{_cache.source_key(path)}.sqlite"
    where = Path(cache_dir) if cache_dir is not None else _cache.default_cache_dir()
    if where.is_dir():  # a cached export serves on machines without nsys too
        target = _cache.cache_root(where) / name
        if _cache.lookup(target, _usable_export):
            return target, True
    nsys = find_nsys()
    if nsys is None:
        raise TraceError(
            f"{path.name}: reading .nsys-rep needs the Nsight Systems CLI (nsys), not found on PATH, "
            f"$NSYS or the standard install dirs; on a machine with nsys run "
            f"`{_how_to_export(path)}` and pass the .sqlite file instead"
        )
    cache = _cache.cache_root(where)
    target = cache / name
    # nsys writes into a private directory (0700, fresh name), then the export is renamed in:
    # an interrupted export never looks finished, two advisors never share a file, and a
    # symlink planted at a predictable name is never written through.
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=cache))
    partial = work / "export.sqlite"
    cmd = [nsys, "export", "--type", "sqlite", "-f", "true", "-o", str(partial), str(path)]
    build = report_build(path)
    written_by = f" (report written by nsys {build})" if build else ""
    try:
        try:
            returncode, stdout, stderr = _run(cmd, timeout)
        except subprocess.TimeoutExpired:
            raise TraceError(
                f"{path.name}: nsys export did not finish within {timeout:g} s "
                f"(set ADVISOR_NSYS_TIMEOUT to allow longer, or run `{_how_to_export(path)}` yourself)"
            ) from None
        except OSError as exc:
            raise TraceError(f"{path.name}: cannot run {nsys} ({exc.strerror or exc})") from None
        if returncode != 0:
            why = _last_line(stderr) or _last_line(stdout) or f"exit code {returncode}"
            raise TraceError(f"{path.name}: nsys export failed{written_by}: {why}")
        if not partial.is_file() or partial.is_symlink():
            raise TraceError(f"{path.name}: nsys export reported success but wrote no export")
        os.chmod(partial, 0o600)  # exports hold the user's kernel names, NVTX text, paths
        os.replace(partial, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target, False


def read(path: Path, *, rank: int = 0, cache_dir: Path | None = None) -> Trace:
    """Export the report to SQLite (or reuse the cached export) and read that; a cached
    export that no longer reads is made again, once."""
    path = Path(path)
    for attempt in range(2):
        exported, cached = _export(path, cache_dir)
        try:
            trace = nsys_sqlite.read(exported, rank=rank)
            break
        except TraceError as exc:
            exported.unlink(missing_ok=True)  # do not reuse an export that cannot be read
            if attempt or not cached:
                raise TraceError(f"{path.name}: its SQLite export cannot be read ({exc})") from None
    trace.meta["format"] = FORMAT
    trace.meta["sources"] = [path.name]
    trace.meta["sqlite_export"] = str(exported)
    return trace
