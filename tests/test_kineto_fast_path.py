"""The Kineto reader's two decoders read the same: msgspec in byte chunks (the fast path)
and the standard library (where msgspec is missing or refuses a chunk). Each test reads one
file both ways, with chunks of a few hundred bytes so that every element boundary, nested
value and odd element meets a chunk edge somewhere, and compares the frames exactly."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from advisor.errors import TraceError
from advisor.traces import _jsonio, load_trace

msgspec = pytest.importorskip("msgspec")

DEVICE = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "computeMajor": 9, "computeMinor": 0,
          "maxThreadsPerMultiprocessor": 2048, "warpSize": 32, "regsPerMultiprocessor": 65536,
          "sharedMemPerMultiprocessor": 233472, "sharedMemPerBlockOptin": 232448}


def events(n: int, seed: int = 0) -> list:
    """Kernels, launches, copies, cpu_ops and annotations, with args in varying key order,
    nested objects before and after args, names with braces and escapes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = 1000.0 + 10 * i
        extra = {"nested": {"a": [1, {"b": "}],"}]}} if i % 3 == 0 else {}
        kernel_args = {"correlation": i, "grid": [rng.randint(1, 512), 1, 1], "block": [128, 1, 1], "device": 0,
                       "stream": 7, "registers per thread": 32, "shared memory": 0, "queued": 0}
        if i % 4 == 1:
            kernel_args = dict(reversed(list(kernel_args.items())))
        out += [
            {"ph": "X", "cat": "cpu_op", "name": f'aten::mm "{i % 5}" }},', "pid": 1, "tid": 1, "ts": t, "dur": 5.5,
             "args": {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}, **extra},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1, "dur": 2,
             "args": {"correlation": i, "grid": None} if i % 7 == 0 else {"correlation": i}},
            {**extra, "ph": "X", "cat": "kernel", "name": f"gemm_kernel_{i % 3}\u00e9", "pid": 0, "tid": 7,
             "ts": t + 3, "dur": 4.25, "args": kernel_args},
        ]
        if i % 5 == 0:
            out.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                        "ts": t + 8, "dur": 1.0, "args": {"bytes": 4096, "device": 0, "stream": 7, "correlation": 10**6 + i}})
        if i % 6 == 0:
            out.append({"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": t, "dur": 9})
    return out


def write(path, evs, raw_events: str | None = None, indent=None):
    body = raw_events if raw_events is not None else ", ".join(json.dumps(e, indent=indent) for e in evs)
    head = json.dumps({"schemaVersion": 1, "deviceProperties": [DEVICE]})[:-1]
    path.write_text(head + ', "traceEvents": [' + body + '], "baseTimeNanoseconds": 1700000000000000000, '
                    '"traceName": "r0"}', encoding="utf-8")
    return path


def read_both(path, monkeypatch, chunk=300):
    """(fast, slow) reads of `path`: frames and notes."""
    monkeypatch.setattr(_jsonio, "_CHUNK", chunk)
    monkeypatch.setattr(_jsonio, "_READ", 256)  # the text window that hands over to the fast path
    fast = load_trace(path, require_kernels=False)
    with monkeypatch.context() as m:
        m.setattr(_jsonio, "msgspec", None)
        slow = load_trace(path, require_kernels=False)
    return fast, slow


def assert_same(fast, slow):
    for name, df in slow.frames().items():
        pd.testing.assert_frame_equal(fast.frames()[name], df, check_exact=True)
    assert fast.meta == slow.meta


@pytest.mark.parametrize("indent", [None, 1])
@pytest.mark.parametrize("chunk", [64, 300, 4096])
def test_fast_and_standard_decoders_agree(tmp_path, monkeypatch, chunk, indent):
    path = write(tmp_path / "t.json", events(120), indent=indent)
    fast, slow = read_both(path, monkeypatch, chunk)
    assert len(slow.kernels) == 120 and len(slow.cpu_ops) == 120 and len(slow.memcpy) == 24
    assert_same(fast, slow)


def test_the_fast_path_is_taken(tmp_path, monkeypatch):
    """Guards the test above against comparing the slow path with itself."""
    calls = []
    real = _jsonio._decode_into
    monkeypatch.setattr(_jsonio, "_decode_into", lambda *a: (calls.append(1), real(*a)))
    write(tmp_path / "t.json", events(50))
    monkeypatch.setattr(_jsonio, "_CHUNK", 500)
    monkeypatch.setattr(_jsonio, "_READ", 256)
    load_trace(tmp_path / "t.json")
    assert len(calls) > 10


@pytest.mark.parametrize("odd", [
    "NaN",  # the standard library reads it, msgspec does not
    '{"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "args": {"Input type": ["\\ud800"]}}',  # lone surrogate
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e400, "dur": 1}',  # beyond a double
    '[1, 2, {"cat": "kernel"}]',  # an element that is not an object
    '{"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 1, "args": [1, 2]}',  # args not an object
    '{"ph": "X", "cat": ["kernel"], "name": "k", "ts": 5, "dur": 1}',
    '{"ph": "X", "cat": "kernel", "cat": "cpu_op", "name": "dup", "ts": 5, "dur": 1}',  # the last key wins
    '{"ph": "X", "cat": "kernel", "name": "' + "x" * 5000 + '", "ts": 5, "dur": 1}',  # longer than a chunk
    "   \n\t  " * 200 + '{"ph": "X", "cat": "kernel", "name": "after blanks", "ts": 5, "dur": 1}',
])
@pytest.mark.parametrize("where", [0, 40, 119])
def test_odd_elements_read_as_the_standard_library_reads_them(tmp_path, monkeypatch, odd, where):
    evs = [json.dumps(e) for e in events(40)]
    evs.insert(min(where, len(evs)), odd)
    path = write(tmp_path / "t.json", None, raw_events=", ".join(evs))
    fast, slow = read_both(path, monkeypatch)
    assert_same(fast, slow)


def test_invalid_utf8_mid_file(tmp_path, monkeypatch):
    path = write(tmp_path / "t.json", events(40))
    data = path.read_bytes().replace(b"gemm_kernel_1\\u00e9", b"gemm_kernel_1\xff\xfe", 3)
    path.write_bytes(data)
    fast, slow = read_both(path, monkeypatch)
    assert fast.kernels["name"].str.contains("\ufffd").sum() == 3
    assert_same(fast, slow)


def test_lone_surrogate_in_a_kernel_name(tmp_path, monkeypatch):
    """A JSON escape of a lone surrogate ("\\ud800") in a kernel name: the standard library
    decodes it into a str that is not UTF-8, which Arrow string columns (pandas 3 with pyarrow)
    refuse. The name is read with U+FFFD there, by both decoders, and the diagnosis goes on."""
    from advisor.diagnose.diagnosis import diagnose

    path = write(tmp_path / "t.json", events(40))
    data = path.read_bytes().replace(b"gemm_kernel_1\\u00e9", b"gemm_kernel_1\\ud800", 3)
    data = data.replace(b'"traceName": "r0"', b'"traceName": "r\\udfff0"')
    path.write_bytes(data)
    fast, slow = read_both(path, monkeypatch)
    assert (fast.kernels["name"] == "gemm_kernel_1\ufffd").sum() == 3
    assert fast.meta["trace_name"] == "r\ufffd0"
    assert_same(fast, slow)
    for trace in (fast, slow):
        out = diagnose(trace).to_dict()
        json.dumps(out, ensure_ascii=False).encode("utf-8")  # a report that can be written out
    # a valid surrogate pair is one character, not two replacements
    path.write_bytes(data.replace(b"gemm_kernel_1\\ud800", b"gemm_kernel_1\\ud83d\\ude00"))
    fast, slow = read_both(path, monkeypatch)
    assert (fast.kernels["name"] == "gemm_kernel_1\U0001f600").sum() == 3
    assert_same(fast, slow)


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.7, 0.99])
def test_corrupt_files_give_the_same_error(tmp_path, monkeypatch, cut):
    path = write(tmp_path / "t.json", events(60))
    data = path.read_bytes()
    at = data.find(b"}, {", int(len(data) * cut)) + 2  # between two events
    path.write_bytes(data[:at] + b"@@" + data[at:])
    errors = []
    for ms in (msgspec, None):
        monkeypatch.setattr(_jsonio, "_CHUNK", 300)
        monkeypatch.setattr(_jsonio, "_READ", 256)
        monkeypatch.setattr(_jsonio, "msgspec", ms)
        with pytest.raises(TraceError) as exc:
            load_trace(path)
        errors.append(str(exc.value))
    assert errors[0] == errors[1]
    assert "at character" in errors[0]
