"""Writing files where someone else may have planted a symlink.

`--out DIR`, `-o FILE` and the cache can be in shared or attacker-prepared places (a CI
workspace, /tmp, a directory unpacked from a bug report). `open(path, "w")` follows a
symlink planted at `path` and writes wherever it points (a shell start-up file, say). Here
every file is written to a fresh temporary name in the same directory, created with
O_CREAT|O_EXCL|O_NOFOLLOW (so it cannot already exist, nor be a link), then renamed over
the target: rename replaces a symlink itself, never what it points to, and a reader never
sees half a file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_temp(directory: Path, name: str, *, private: bool = False) -> tuple[int, Path]:
    """(fd, path) of a new file in `directory`, named after `name`, that did not exist and is
    not a link. Mode 0600 when `private`, else 0666 less the umask (like open())."""
    for _ in range(100):
        tmp = Path(directory) / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, _FLAGS, 0o600 if private else 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temporary file in {directory}")


def write_file(path: str | os.PathLike, data: bytes | str, *, private: bool = False) -> Path:
    """Write `data` (str: UTF-8) to `path` atomically, replacing whatever is there, a
    symlink included, without following it. OSError reaches the caller."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = create_temp(path.parent, path.name, private=private)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_regular(path: str | os.PathLike) -> bytes | None:
    """The content of `path` if it is a regular file (not a symlink), else None: for files
    we append to, whose old content is rewritten with write_file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, OSError):
        return None
    with os.fdopen(fd, "rb") as fh:
        import stat

        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read()
