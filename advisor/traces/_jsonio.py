"""Loading JSON trace files (plain or gzip, told apart by content) and converting their
numbers without losing precision. Shared by the Kineto and rocprofv3 JSON readers."""

from __future__ import annotations

import codecs
import contextlib
import gc
import json
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from ..errors import TraceError
from ._inflate import read_all

try:  # decodes a Kineto trace's events ~4x faster than json, straight into typed structs
    import msgspec
except ImportError:  # the standard library's decoder reads every file too, more slowly
    msgspec = None


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic (whatever its name),
    inflated in bounded chunks and never past the cap (`_inflate.max_inflated_bytes`)."""
    return read_all(path)


def load_json(path: Path, what: str) -> Any:
    """Parse the JSON document in `path`; a truncated or corrupt file is a one-line
    TraceError naming `what` (e.g. "PyTorch profiler") and where parsing stopped."""
    data = read_bytes(path)
    try:
        try:
            doc = json.loads(data)
        except UnicodeDecodeError:
            # Profilers copy kernel names byte for byte; one that is not UTF-8 should not cost
            # the whole trace: read it with replacement characters.
            doc = json.loads(data.decode("utf-8", "replace"))
        return no_surrogates(doc) if _SURROGATE_ESCAPE_B.search(data) else doc
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path.name}: truncated or corrupt {what} JSON ({exc.msg} at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise TraceError(f"{path.name}: corrupt {what} JSON ({exc})") from None
    except MemoryError:
        raise TraceError(f"{path.name}: {what} JSON too large to parse in this machine's memory") from None


def to_float(values: Sequence[Any]) -> np.ndarray:
    """float64 array of `values` (numbers or numeric strings); anything else becomes NaN."""
    try:
        arr = np.asarray(values, dtype="float64")
        if arr.ndim == 1:  # a list of equal-length lists would make a 2-D array
            return arr
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float range
        pass
    return _numeric(list(values)).to_numpy(dtype="float64", na_value=np.nan)


def _float_or_nan(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def _numeric(values: list) -> pd.Series:
    """pd.to_numeric(errors="coerce") of `values`, surviving integers too large for a float
    (a JSON number with 400 digits), which become NaN like any other non-number."""
    try:
        return pd.to_numeric(pd.Series(values, dtype="object"), errors="coerce")
    except OverflowError:
        return pd.Series([_float_or_nan(v) for v in values], dtype="float64")


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """Microseconds (float64, finite) to integer nanoseconds, rounded to the nearest ns.

    Splits off the integer part first: multiplying a large timestamp such as
    1752830085464752.5 us by 1000 in float64 would round to a multiple of 256 ns, while the
    integer part times 1000 is exact in int64 and the fraction keeps its own precision."""
    whole = np.floor(us)
    frac = us - whole
    return whole.astype("int64") * 1000 + np.rint(frac * 1000.0).astype("int64")


def to_int(values: Sequence[Any] | np.ndarray | pd.Series) -> pd.Series:
    """Nullable Int64 series of `values`; entries that are not whole numbers become <NA>.

    Python ints go straight into the Int64 array (no float64 detour, so nanosecond
    timestamps beyond 2**53 stay exact); numeric strings are parsed; floats are rounded."""
    index = None
    if isinstance(values, pd.Series):
        index = values.index
        if isinstance(values.dtype, pd.Int64Dtype):
            return values
        if values.dtype.kind in "ib":
            return values.astype("Int64")
        if values.dtype.kind in "uf":
            return pd.Series(_int64_or_na(values.to_numpy(dtype="float64", na_value=np.nan), values.to_numpy()), index=index)
        values = values.tolist()
    elif isinstance(values, np.ndarray):
        if values.dtype.kind in "ib":
            return pd.Series(values.astype("int64")).astype("Int64")
        if values.dtype.kind in "uf":
            return pd.Series(_int64_or_na(values.astype("float64"), values))
        values = values.tolist()
    else:
        values = list(values)
    if values.count(None) == len(values):
        # a field no event has (Kineto's graph node and collective sizes, mostly): pandas
        # took ~9x longer over a list of None than over ints (~0.6 s of a 2M-event read)
        return pd.Series(pd.arrays.IntegerArray(np.ones(len(values), dtype=np.int64), np.ones(len(values), dtype=bool)),
                         index=index)
    try:
        with np.errstate(invalid="ignore", over="ignore"):  # pandas tries a float cast first
            arr = pd.array(values, dtype="Int64")
    except (TypeError, ValueError, OverflowError):
        s = _numeric(values)
        if s.dtype.kind in "ib":
            arr = s.astype("Int64").array
        else:
            arr = _int64_or_na(s.to_numpy(dtype="float64", na_value=np.nan), s.to_numpy())
    return pd.Series(arr, index=index)


_INT64_LIMIT = 2.0**63


def _int64_or_na(as_float: np.ndarray, original: np.ndarray) -> pd.arrays.IntegerArray:
    """Int64 array of numbers given as floats (or uint64): rounded; NaN, infinities and
    values outside int64 (a corrupt or hostile file's 1e300 or 2**64) become <NA>."""
    ok = np.isfinite(as_float) & (np.abs(as_float) < _INT64_LIMIT)
    if original.dtype.kind == "u":
        ints = np.where(ok, original, 0).astype("int64")  # exact below 2**63
    else:
        ints = np.round(np.where(ok, as_float, 0.0)).astype("int64")
    return pd.arrays.IntegerArray(ints, ~ok)


def key(value: Any) -> Any:
    """`value` if it can be a dict key (number, string, None), else None: ids read from a
    file are looked up in dicts, and a corrupt file may hold a list or an object there."""
    return value if value is None or isinstance(value, (int, float, str)) else None


def handle(value: Any) -> Any:
    """rocprofiler-sdk writes ids either as plain numbers or as {"handle": N}; return N
    (None when it is neither a number nor a string)."""
    if isinstance(value, dict):
        value = value.get("handle")
    return key(value)


def as_dict(value: Any) -> dict:
    """`value` if it is a JSON object, else {} (for fields a corrupt file fills with junk)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    """`value` if it is a JSON array, else []."""
    return value if isinstance(value, list) else []


# ---------------------------------------------------------------------------------------
# Streaming: a top-level object whose one big array is handed out element by element.

_WS = re.compile(r"[ \t\n\r]*")
_DECODE = json.JSONDecoder().raw_decode
_READ = 1 << 20  # bytes of content decoded per step; doubles while one element does not fit

# A surrogate escape (\ud800-\udfff) in JSON text: the standard library decodes a lone one into
# a str that cannot be encoded as UTF-8, which Arrow-backed string columns (pandas 3 with
# pyarrow) then refuse. Such values are rare; the text is searched for the escape first.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_SURROGATE_ESCAPE_B = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(value: Any) -> Any:
    """`value` (decoded JSON) with every lone surrogate in its strings, keys included,
    replaced by U+FFFD, as the decoder already does for bytes that are not UTF-8."""
    if type(value) is str:
        return _LONE_SURROGATE.sub("\ufffd", value)
    if type(value) is list:
        return [no_surrogates(v) for v in value]
    if type(value) is dict:
        return {no_surrogates(k): no_surrogates(v) for k, v in value.items()}
    return value


class _Text:
    """The content of a (possibly gzipped) JSON file as a sliding window of text: memory
    holds the unread window only, never the whole document."""

    def __init__(self, fh):
        self.fh = fh
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")  # names not in UTF-8 survive
        self.buf = ""
        self.pos = 0
        self.base = 0  # characters dropped before buf[0], for error positions
        self.eof = False
        self.want = _READ

    def more(self, grow: bool = False) -> bool:
        """Read the next piece; `grow`: one value does not fit the window, so read twice as
        much as last time (an element of n bytes then costs O(n) to decode, not O(n^2)).
        False at the end of the content."""
        if self.eof:
            return False
        if grow:
            self.want = min(self.want * 2, 1 << 30)
        data = self.fh.read(self.want)
        text = self.dec.decode(data, final=not data)
        if not data:
            self.eof = True
        if self.pos > 0:
            self.base += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        if not self.buf and text.startswith("\ufeff") and self.base == 0:
            text = text[1:]  # a UTF-8 BOM
        self.buf += text
        return bool(text) or not self.eof

    def ws(self) -> str:
        """Skip whitespace; the next character ('' at the end)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def value(self) -> Any:
        """Decode the JSON value at the cursor (reading on while it is cut by the window)."""
        self.ws()
        while True:
            try:
                obj, end = _DECODE(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number cut at the window's edge would parse short
                    if _SURROGATE_ESCAPE.search(self.buf, self.pos, end):
                        obj = no_surrogates(obj)
                    self.pos = end
                    self.want = _READ
                    return obj
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise json.JSONDecodeError(exc.msg, exc.doc, exc.pos + self.base) from None
            if not self.more(grow=True):
                self.eof = True

    def expect(self, chars: str) -> str:
        ch = self.ws()
        if not ch or ch not in chars:
            what = "end of file" if not ch else repr(ch)
            raise json.JSONDecodeError(f"expected {' or '.join(map(repr, chars))}, got {what}", "", self.base + self.pos)
        self.pos += 1
        return ch


_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


def _items(t: _Text, on_item: Callable[[Any], None]) -> None:
    """The elements of the array at the cursor (its '[' consumed) to `on_item`, through ']'.
    The common case (element and separator whole inside the window) costs one C decode and
    one regex match; anything else goes through _Text's careful methods."""
    decode, sep = _DECODE, _SEP.match
    while True:
        buf, pos = t.buf, t.pos
        try:
            obj, end = decode(buf, pos)
            m = sep(buf, end)
        except json.JSONDecodeError:
            m = None
        if m is None or m.end() >= len(buf):  # cut by the window, or odd: the slow path
            t.ws()
            on_item(t.value())
            if t.expect(",]") == "]":
                return
            t.ws()
            continue
        if _SURROGATE_ESCAPE.search(buf, pos, end):
            obj = no_surrogates(obj)
        on_item(obj)
        t.pos = m.end()
        if m.group(1) == "]":
            return


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off for the block. Decoding creates millions of small
    dicts and lists (no cycles: reference counting frees them); each batch of allocations set
    off a collection that walked every live object, a third of a Kineto read's time (200k
    events: 5.0 s -> 3.3 s with it paused)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# The array's elements in byte chunks of about this size go to msgspec at once; a chunk is
# cut after an element's closing brace, found by trying the last candidates (see _fast_items).
_CHUNK = 4 << 20
_MAX_CHUNK = 256 << 20  # one element bigger than this goes to the text path
_CUTS = 8  # candidate cut points tried per chunk before reading on
_BYTE_AT = re.compile(r"\(byte (\d+)\)")


class _Fallback(Exception):
    """The fast path cannot read on (content msgspec refuses, or an odd layout): the text
    path reads on from `rest` (bytes not yet decoded; the file handle follows), `consumed`
    characters into the array."""

    def __init__(self, rest: bytes, consumed: int = 0):
        self.rest, self.consumed = rest, consumed


def _chars(data: bytes) -> int:
    """Characters in valid UTF-8 `data` (error positions count characters, as the text path)."""
    return len(data) if data.isascii() else len(data.decode("utf-8"))


def _fast_items(fh, start: bytes, item_type, convert, on_items) -> tuple[bytes, int]:
    """Elements of the array whose '[' was consumed, decoded by msgspec in chunks into
    `item_type` structs (fields it does not declare are skipped in C) and handed to
    `on_items` a chunk at a time. Returns (the bytes after the closing ']', characters
    consumed). Raises _Fallback where msgspec cannot read the content the way the standard
    library would (invalid UTF-8, NaN, lone surrogates, numbers beyond a double...).

    A chunk is cut after a '}' followed by ',' or ']'. A cut inside a string or a nested
    value leaves something open that the one added ']' cannot close, so a cut is right
    exactly when `[` + chunk + `]` decodes; a wrong cut fails at the end of that text, a real
    error before it, so a few candidates from the end are tried."""
    typed = msgspec.json.Decoder(list[item_type])
    plain = msgspec.json.Decoder()
    buf, consumed, eof, want = start, 0, False, _CHUNK
    while True:
        pieces, have = [buf], len(buf)
        while not eof and have < want:
            data = fh.read(min(want - have, _CHUNK))
            if not data:
                eof = True
            elif not have:  # whitespace between elements never piles up (a whitespace bomb)
                rest = data.lstrip(b" \t\n\r")
                consumed += len(data) - len(rest)
                data = rest
            pieces.append(data)
            have += len(data)
        buf = b"".join(pieces)
        del pieces
        try:
            done = _fast_chunk(buf, typed, plain, convert, on_items)
        except _Fallback as fb:
            raise _Fallback(fb.rest, consumed) from None
        if done is None:  # no cut worked: one element longer than the chunk, or the end cut short
            if eof or want >= _MAX_CHUNK:
                raise _Fallback(buf, consumed)
            want *= 2
            continue
        cut, last = done
        consumed += _chars(buf[:cut])
        buf = buf[cut:]
        want = _CHUNK
        if last:
            return buf, consumed


_SEP_AFTER = re.compile(rb"[ \t\n\r]*([,\]])")
_EMPTY_END = re.compile(rb"[ \t\n\r]*\]")


def _fast_chunk(buf: bytes, typed, plain, convert, on_items):
    """Decode the longest run of whole elements at the start of `buf` (see _fast_items):
    (bytes consumed including the separator, whether that was the closing ']'), or None."""
    m = _EMPTY_END.match(buf)
    if m is not None:  # the array ends here
        return m.end(), True
    end = len(buf)
    for _ in range(_CUTS):
        close = buf.rfind(b"}", 0, end)
        if close < 0:
            return None
        end = close
        m = _SEP_AFTER.match(buf, close + 1)
        if m is None:
            continue
        span = b"[" + buf[: close + 1] + b"]"
        try:
            try:
                _decode_into(span, typed, plain, convert, on_items)
            except msgspec.DecodeError as exc:
                at = _BYTE_AT.search(str(exc))
                at = int(at.group(1)) if at is not None else len(span)
                if "trailing characters" in str(exc):
                    # our '[' closed early, at the array's own ']': the whole array is span[:at]
                    _decode_into(span[:at], typed, plain, convert, on_items)
                    return at - 1, True
                if at < len(span) - 1:
                    raise _Fallback(b"") from None  # an error inside the text, not a wrong cut
                continue
        except (_Fallback, msgspec.DecodeError):
            raise _Fallback(buf) from None
        return m.end(), m.group(1) == b"]"
    return None


def _decode_into(span: bytes, typed, plain, convert, on_items) -> None:
    """`span` (a JSON array) decoded into structs and passed on; an element of another shape
    (not an object, args not an object...) sends the span through plain values and
    `convert`. DecodeError when `span` is not JSON; _Fallback when msgspec refuses values the
    standard library reads."""
    try:
        items = typed.decode(span)
    except msgspec.ValidationError:
        try:
            values = plain.decode(span)  # DecodeError (a wrong cut) goes to the caller
        except msgspec.ValidationError:  # a number beyond a double, say: the text path's job
            raise _Fallback(b"") from None
        items = [x for x in map(convert, values) if x is not None]
    on_items(items)


def stream_object(path: Path, list_key: str, on_items: Callable[[list], None], what: str,
                  item_type: type | None = None, convert: Callable[[Any], Any] | None = None) -> dict | None:
    """Read the JSON object in `path` in bounded memory: every top-level value except
    `list_key`'s is returned in a dict; when `list_key` holds an array, its elements are
    passed to `on_items` a list at a time as they are decoded (and the dict gets
    `list_key: True`). None when the document is not an object. Errors are one-line
    TraceErrors naming `what`.

    With `item_type` (a msgspec Struct) and msgspec installed, the array is decoded by
    msgspec into those structs, several MB at a time; the standard library's decoder takes
    over where msgspec refuses the content, and every element it decodes goes through
    `convert` (value -> item_type or None to skip), so both paths hand out the same items."""
    from ._inflate import open_content

    fast = item_type is not None and msgspec is not None
    if not fast and convert is not None:
        one = on_items

        def on_items(items, _c=convert, _one=one):
            _one([x for x in map(_c, items) if x is not None])

    def slow(v):
        on_items([v])

    try:
        with open_content(path) as fh:
            t = _Text(fh)
            first = t.ws()
            if first != "{":
                t.value()  # a valid non-object document is "not this format"; garbage is corrupt
                return None
            t.pos += 1
            out: dict = {}
            if t.ws() == "}":
                t.pos += 1
            else:
                while True:
                    if t.ws() != '"':
                        t.expect('"')
                    name = t.value()
                    t.expect(":")
                    if name == list_key and t.ws() == "[":
                        t.pos += 1
                        out[list_key] = True
                        if fast:
                            _array_fast(t, item_type, convert, on_items)
                        elif t.ws() == "]":
                            t.pos += 1
                        else:
                            _items(t, slow)
                    else:
                        out[name] = t.value()
                    if t.expect(",}") == "}":
                        break
            if t.ws():
                raise json.JSONDecodeError("Extra data", "", t.base + t.pos)
            return out
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path.name}: truncated or corrupt {what} JSON ({exc.msg} at character {exc.pos:,})") from None
    except RecursionError:
        raise TraceError(f"{path.name}: corrupt {what} JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path.name}: corrupt {what} JSON ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read ({exc.strerror or exc})") from None
    except MemoryError:
        raise TraceError(f"{path.name}: {what} JSON too large to parse in this machine's memory") from None


def _array_fast(t: _Text, item_type, convert, on_items) -> None:
    """The array at `t`'s cursor (its '[' consumed) through msgspec, `t` left after its ']'
    with the same window and positions the text path would have; where msgspec gives up,
    the text path reads the rest of the array."""
    pending, _ = t.dec.getstate()
    start = t.buf[t.pos:].encode("utf-8") + pending  # the window came from UTF-8 (invalid bytes replaced)
    t.base += t.pos
    t.buf, t.pos = "", 0
    t.dec.reset()
    try:
        rest, consumed = _fast_items(t.fh, start, item_type, convert, on_items)
    except _Fallback as fb:
        t.base += fb.consumed
        t.buf = t.dec.decode(fb.rest)

        def one(v):
            x = convert(v)
            if x is not None:
                on_items([x])

        if t.ws() == "]":
            t.pos += 1
        else:
            _items(t, one)
        return
    t.base += consumed
    t.buf = t.dec.decode(rest)
