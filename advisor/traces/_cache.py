"""The cache of converted traces (nsys exports, gunzipped SQLite), safe on shared hosts.

- The directory must be ours and writable by no one else (created 0700); otherwise another
  user could plant an export that we would report as the user's trace. One that is not is
  refused with a one-line error naming `--cache-dir`.
- Entries are keyed on the source's content identity: size, mtime in ns and a SHA-256 of its
  first MiB (a full hash of a multi-GB report would cost seconds on every run).
- Entries are created under a fresh O_EXCL|O_NOFOLLOW name with mode 0600, then renamed in
  (advisor.safeio); a finished entry is used only if it is a regular file (not a link), ours,
  0600 and passes the caller's check; anything else is removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Callable

from ..errors import TraceError

HEAD_BYTES = 1 << 20


def default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "advisor"


def source_key(path: Path) -> str:
    """Hex key of `path`'s content identity: size, mtime_ns and the hash of its head."""
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(HEAD_BYTES))
    return h.hexdigest()[:20]


def cache_root(cache_dir: Path | None) -> Path:
    """The cache directory, created 0700 if missing; TraceError when it is not a directory
    we own that no one else can write to."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(cache)
    except OSError as exc:
        raise TraceError(f"cannot create the cache dir {cache} ({exc.strerror or exc}); pass --cache-dir") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TraceError(f"cache dir {cache} is not a directory; pass --cache-dir")
    if hasattr(os, "getuid"):
        if st.st_uid != os.getuid():
            raise TraceError(f"cache dir {cache} belongs to another user (uid {st.st_uid}); pass --cache-dir with a directory of yours")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise TraceError(
                f"cache dir {cache} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): someone could plant "
                f"a trace there; `chmod go-w` it or pass --cache-dir"
            )
    return cache


def lookup(entry: Path, valid: Callable[[Path], bool]) -> Path | None:
    """`entry` if it is a finished, trustworthy cache entry; a bad one is removed (None)."""
    try:
        fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP) or something we cannot open: not ours to trust
        _discard(entry)
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    ours = not hasattr(os, "getuid") or (st.st_uid == os.getuid() and not st.st_mode & 0o077)
    if stat.S_ISREG(st.st_mode) and ours and valid(entry):
        return entry
    _discard(entry)
    return None


def _discard(entry: Path) -> None:
    try:
        if entry.is_dir() and not entry.is_symlink():
            return  # not something we made: leave it, the rename over it will fail loudly
        entry.unlink()
    except OSError:
        pass
