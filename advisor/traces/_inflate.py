"""A trace file's content as a bounded stream: gzip inflated chunk by chunk, never past a cap.

Traces arrive from machines we do not control, and gzip can expand 1000-fold: a 5 MiB file
can hold 6 GiB. Nothing here holds more than one chunk of inflated data beyond what the
caller asks for, and inflating stops with a one-line TraceError once the total passes the cap.

The cap (`max_inflated_bytes`): 4 GiB by default, `ADVISOR_MAX_INFLATED_BYTES` or the CLI's
`--max-inflated-bytes` to change it (`16G`, `500M`, bytes). Why 4 GiB: it is twice the largest
single-rank trace we size for (a 2 GB Kineto JSON; a 10M-kernel nsys export is ~1.4 GiB), so
no real per-rank file meets it, while a bomb is refused after ~10 s of inflating (zlib inflates
~400 MB/s here) and a `.sqlite.gz` can never put more than that in the cache.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import re
import zlib
from pathlib import Path
from typing import Iterator

from ..errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_INFLATED = 4 << 30
ENV = "ADVISOR_MAX_INFLATED_BYTES"
CHUNK = 1 << 20  # compressed bytes read per step; inflated output is bounded per call too

_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar("max_inflated_bytes", default=None)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*\Z", re.I)


def parse_size(text: str | int) -> int:
    """Bytes from `4294967296`, `4G`, `4GiB`, `500M`, `1.5g` (powers of 1024). ValueError else."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise ValueError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)")
        scale = 1024 ** "_kmgt".index(m.group(2).lower() or "_")
        value = int(float(m.group(1)) * scale)
    if value <= 0 or value >= 2**62:
        raise ValueError(f"{text!r}: the size must be positive and below 2^62 bytes")
    return value


def max_inflated_bytes() -> int:
    """The cap in force: set by `limit()` (load_trace's argument), else the environment, else 4 GiB."""
    cap = _cap.get()
    if cap is not None:
        return cap
    raw = os.environ.get(ENV)
    if not raw:
        return DEFAULT_MAX_INFLATED
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise TraceError(f"{ENV}: {exc}") from None


@contextlib.contextmanager
def limit(cap: int | str | None) -> Iterator[None]:
    """Within the block, inflate at most `cap` bytes per file (None: keep the default)."""
    if cap is None:
        yield
        return
    try:
        value = parse_size(cap)
    except ValueError as exc:
        raise TraceError(f"max_inflated_bytes: {exc}") from None
    token = _cap.set(value)
    try:
        yield
    finally:
        _cap.reset(token)


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _too_big(name: str, cap: int) -> TraceError:
    return TraceError(
        f"{name}: inflates to more than {cap:,} bytes (a gzip bomb, or a trace bigger than the cap); "
        f"if it is a real trace, raise the cap with --max-inflated-bytes or {ENV}"
    )


class _Inflating(io.RawIOBase):
    """Readable stream of the inflated content of a gzip file (several members allowed, as
    gzip concatenation makes), failing once more than `cap` bytes came out."""

    def __init__(self, fh, name: str, cap: int):
        self._fh, self._name, self._cap = fh, name, cap
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""  # compressed input not yet inflated
        self._total = 0
        self._eof = False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        try:
            self._fh.close()
        finally:
            super().close()

    def _inflate(self, n: int) -> bytes:
        while True:
            if self._d.eof:  # a member ended: another may follow (zero padding allowed)
                data = self._d.unused_data.lstrip(b"\x00")
                if not data:
                    more = self._fh.read(CHUNK)
                    if not more:
                        self._eof = True
                        return b""
                    data = more.lstrip(b"\x00")
                    if not data:
                        continue
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif self._d.unconsumed_tail:
                data = self._d.unconsumed_tail
            else:
                data = self._fh.read(CHUNK)
                if not data:
                    raise TraceError(f"{self._name}: truncated gzip data (the stream ends early)")
            try:
                out = self._d.decompress(data, n)
            except zlib.error as exc:
                raise TraceError(f"{self._name}: truncated or corrupt gzip data ({exc})") from None
            if out:
                return out

    def readinto(self, buf) -> int:
        if self._eof:
            return 0
        out = self._inflate(len(buf))
        self._total += len(out)
        if self._total > self._cap:
            raise _too_big(self._name, self._cap)
        buf[: len(out)] = out
        return len(out)


def open_content(path: Path, *, cap: int | None = None) -> io.BufferedReader:
    """The file's content as a binary stream: gunzipped when it starts with the gzip magic
    (whatever its name), read as is otherwise. OSError reaches the caller."""
    fh = open(path, "rb")
    try:
        gz = fh.read(2) == GZIP_MAGIC
        fh.seek(0)
    except BaseException:
        fh.close()
        raise
    if not gz:
        return fh
    return io.BufferedReader(_Inflating(fh, Path(path).name, cap if cap is not None else max_inflated_bytes()), CHUNK)


def read_all(path: Path, *, cap: int | None = None) -> bytes:
    """The whole content (gunzipped), for readers that need it in memory; a plain file larger
    than the cap is refused too, before it is read."""
    cap = cap if cap is not None else max_inflated_bytes()
    name = Path(path).name
    try:
        if not is_gzip(path) and os.path.getsize(path) > cap:
            raise _too_big(name, cap)
        with open_content(path, cap=cap) as fh:
            return fh.read()
    except OSError as exc:
        raise TraceError(f"{name}: cannot read ({exc.strerror or exc})") from None
    except MemoryError:
        raise TraceError(f"{name}: too large to read into this machine's memory") from None
