"""Memory-bound kernels that run far below the GPU's bandwidth, and what their fixes reach.

    python3 bench/bench_memory_bound.py [--out DIR] [--reps 7] [--no-compile] [--no-trace]

Calibrates the `slow_memory_bound_kernel` rule (rules/slow_memory_bound_kernel.toml): for each
case the eager PyTorch call a real trace showed running at a few percent of the HBM bandwidth
(our hold-out traces: SegFormer's NHWC upsampling, a GNN's atomic index_add_, an fp8 FFN's
quantisation; docs/holdout.md), and the fixes the rule would recommend, timed side by side in
one run, each checked against the eager result (relative Frobenius error) before it is timed.
Plain copies and a vectorized add give the rate a good memory-bound kernel reaches.

Timing: CUDA events around 10 calls on rotating input sets (>= 3x the L2 in all, so the L2
does not serve them), repeated --reps times; p20/p50/p80 over the repeats, per call. The bytes
column is the case's compulsory traffic (inputs read once, outputs written once), the same
count the rule makes from a trace's Input Dims; TB/s is bytes over the p50.

Writes into --out (default $OUT, else bench/results/memory_bound): memory_bound.csv (long
format: case, provider, metric, unit, p50, p20, p80, bytes, gpu, timestamp, version),
memory_bound.md (per case: each provider's time, TB/s, fraction of the copy rate and speedup
over eager) and, unless --no-trace, Kineto traces (record_shapes) of two calls of every eager
case (trace_eager.json.gz) and of every fix (trace_fixed.json.gz): the rule's true-positive
and true-negative fixtures. About 3 minutes on one H200 (most of it compiling).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import math
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

L2_BYTES = 60 * 2**20


def _rotations(nbytes: int) -> int:
    """Input sets to rotate through so that the L2 serves none of them (>= 3x L2, at most 8)."""
    return max(1, min(8, math.ceil(3 * L2_BYTES / max(nbytes, 1))))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def _time(fn, sets, reps: int) -> list[float]:
    """us per call: events around 10 calls on rotating sets, `reps` times."""
    for s in sets:  # warm-up (and compile) on every set
        fn(*s)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(10):
            fn(*sets[i % len(sets)])
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / 10)
    return out


def _pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# --------------------------------------------------------------------------------------------
# Cases: (name, make(seed) -> args, bytes, {provider: fn}, tolerance); "eager" is the reference
# --------------------------------------------------------------------------------------------


def _maybe_compile(fn, on: bool):
    return torch.compile(fn, dynamic=False) if on else None


def cases(dev: str, compile_on: bool):
    out = []

    # 1. GraphSAGE-style neighbour sum: index_add_ over 4M unsorted edges into 200k nodes (bf16).
    N, Fd, E = 200_000, 256, 4_000_000

    def make_scatter(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        idx = torch.randint(0, N, (E,), device=dev, generator=g)
        src = torch.randn(E, Fd, device=dev, dtype=torch.bfloat16, generator=g)
        order = torch.argsort(idx, stable=True)  # the graph is static: sorted once, outside the step
        idx_s, src_s = idx[order], src[order]
        lengths = torch.bincount(idx_s, minlength=N)
        return (idx, src, idx_s, src_s, lengths, torch.empty(N, Fd, device=dev, dtype=torch.bfloat16))

    def scatter_eager(idx, src, idx_s, src_s, lengths, out):
        out.zero_()
        return out.index_add_(0, idx, src)

    def scatter_sorted(idx, src, idx_s, src_s, lengths, out):
        out.zero_()
        return out.index_add_(0, idx_s, src_s)

    def scatter_segment(idx, src, idx_s, src_s, lengths, out):
        return torch.segment_reduce(src_s, "sum", lengths=lengths, axis=0, unsafe=True)

    scatter_bytes = E * 8 + E * Fd * 2 + N * Fd * 2  # index + source read, output written
    out.append(("index_add_unsorted", make_scatter, scatter_bytes,
                {"eager": scatter_eager, "sorted_index_add": scatter_sorted, "segment_reduce": scatter_segment},
                3e-2))  # bf16 atomics round every partial sum (u = 2^-8, ~20 terms a row)

    # 2. SegFormer decode head: bilinear upsampling of channels_last fp16 maps to 128x128.
    for hw in (64, 32):
        def make_up(seed, hw=hw):
            g = torch.Generator(device=dev).manual_seed(seed)
            x = torch.randn(16, 768, hw, hw, device=dev, dtype=torch.float16, generator=g)
            return (x.contiguous(memory_format=torch.channels_last), x.contiguous())

        def up_eager(x_cl, x):
            return F.interpolate(x_cl, size=(128, 128), mode="bilinear", align_corners=False)

        def up_nchw(x_cl, x):  # the same op on an NCHW tensor (a model kept channels-first)
            return F.interpolate(x, size=(128, 128), mode="bilinear", align_corners=False)

        up_comp = _maybe_compile(up_eager, compile_on)
        provs = {"eager": up_eager, "nchw_input": up_nchw}
        if up_comp:
            provs["compiled"] = up_comp
        nbytes = 16 * 768 * (hw * hw + 128 * 128) * 2
        out.append((f"upsample_bilinear_nhwc_{hw}to128", make_up, nbytes, provs, 2e-3))

    # 3. fp8 quantisation of an activation (per-tensor scale): abs, amax, divide, cast.
    def make_q(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return (torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16, generator=g),)

    def quant_eager(x):
        scale = x.abs().amax().float() / 448.0
        return (x / scale).to(torch.float8_e4m3fn)

    quant_comp = _maybe_compile(quant_eager, compile_on)
    provs = {"eager": quant_eager}
    if quant_comp:
        provs["compiled"] = quant_comp
    out.append(("fp8_quantise", make_q, 8192 * 4096 * (2 + 2 + 1), provs, 7e-2))  # x read twice, fp8 written

    def make_div(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return (torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16, generator=g),
                torch.full((), 3.0, device=dev, dtype=torch.float32))

    def div_eager(x, scale):  # the divide alone: a bf16 tensor by a 0-dim fp32 tensor (PyTorch's mixed-type path)
        return x / scale

    def div_same_dtype(x, scale):  # the scale cast to the tensor's dtype first: the vectorized path
        return x / scale.to(x.dtype)

    out.append(("div_by_fp32_scalar_tensor", make_div, 8192 * 4096 * 4, {"eager": div_eager, "same_dtype": div_same_dtype},
                1e-2))

    # 4. SegFormer's layer norm over 64 channels, and its channels_last broadcast add.
    def make_ln(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return (torch.randn(16, 16384, 64, device=dev, dtype=torch.float16, generator=g),
                torch.randn(64, device=dev, dtype=torch.float16, generator=g),
                torch.randn(64, device=dev, dtype=torch.float16, generator=g))

    def ln_eager(x, w, b):
        return F.layer_norm(x, (64,), w, b)

    ln_comp = _maybe_compile(ln_eager, compile_on)
    provs = {"eager": ln_eager}
    if ln_comp:
        provs["compiled"] = ln_comp
    out.append(("layer_norm_64", make_ln, 2 * 16 * 16384 * 64 * 2, provs, 2e-3))

    def make_add(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        x = torch.randn(16, 64, 128, 128, device=dev, dtype=torch.float16, generator=g)
        return (x.contiguous(memory_format=torch.channels_last), torch.randn(1, 64, 1, 1, device=dev, dtype=torch.float16,
                                                                           generator=g))

    def add_eager(x, bias):
        return x + bias

    add_comp = _maybe_compile(add_eager, compile_on)
    provs = {"eager": add_eager}
    if add_comp:
        provs["compiled"] = add_comp
    out.append(("add_bias_channels_last", make_add, 2 * 16 * 64 * 128 * 128 * 2, provs, 1e-3))

    # 4b. ConvNeXt's and Swin's layer norms over 96 and 192 channels (NHWC rows), fp16.
    for n, hw, c in ((128, 56, 96), (128, 28, 192)):
        def make_ln_c(seed, n=n, hw=hw, c=c):
            g = torch.Generator(device=dev).manual_seed(seed)
            return (torch.randn(n, hw, hw, c, device=dev, dtype=torch.float16, generator=g),
                    torch.randn(c, device=dev, dtype=torch.float16, generator=g),
                    torch.randn(c, device=dev, dtype=torch.float16, generator=g))

        def ln_c(x, w, b):
            return F.layer_norm(x, (x.shape[-1],), w, b)

        comp = _maybe_compile(ln_c, compile_on)
        provs = {"eager": ln_c}
        if comp:
            provs["compiled"] = comp
        out.append((f"layer_norm_{c}", make_ln_c, 2 * n * hw * hw * c * 2, provs, 2e-3))

    # 4c. ResNet-50's max-pool backward (bf16, 64 x 64 x 112^2 -> 56^2), NCHW and channels_last.
    for cl in (False, True):
        def make_mp(seed, cl=cl):
            g = torch.Generator(device=dev).manual_seed(seed)
            x = torch.randn(64, 64, 112, 112, device=dev, dtype=torch.bfloat16, generator=g)
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            y, idx = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
            gy = torch.randn_like(y)
            return (gy, x, idx)

        def mp_bwd(gy, x, idx):
            return torch.ops.aten.max_pool2d_with_indices_backward(gy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

        comp = _maybe_compile(mp_bwd, compile_on)
        provs = {"eager": mp_bwd}
        if comp:
            provs["compiled"] = comp
        # grad_out and indices read, grad_input written (the forward input is not read)
        out.append((f"max_pool_backward_{'nhwc' if cl else 'nchw'}", make_mp, 64 * 64 * (56 * 56 * (2 + 8) + 112 * 112 * 2),
                    provs, 1e-2))

    # 4d. EfficientNet's training batch norm over 32 channels, channels_last (statistics + normalise).
    def make_bn(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        x = torch.randn(128, 32, 112, 112, device=dev, dtype=torch.bfloat16, generator=g)
        return (x.contiguous(memory_format=torch.channels_last), torch.randn(32, device=dev, generator=g),
                torch.randn(32, device=dev, generator=g), torch.zeros(32, device=dev), torch.ones(32, device=dev))

    def bn_train(x, w, b, rm, rv):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.0)

    comp = _maybe_compile(bn_train, compile_on)
    provs = {"eager": bn_train}
    if comp:
        provs["compiled"] = comp
    out.append(("batch_norm_train_nhwc_32ch", make_bn, 3 * 128 * 32 * 112 * 112 * 2, provs, 2e-2))

    # 5. What a good memory-bound kernel reaches: a copy and a vectorized add of 256 MB.
    def make_big(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return (torch.randn(64 * 2**20, device=dev, dtype=torch.bfloat16, generator=g),
                torch.randn(64 * 2**20, device=dev, dtype=torch.bfloat16, generator=g))

    out.append(("reference_add_bf16", make_big, 3 * 64 * 2**20 * 2, {"eager": lambda x, y: x + y}, 0.0))
    out.append(("reference_clone_bf16", make_big, 2 * 64 * 2**20 * 2, {"eager": lambda x, y: x.clone()}, 0.0))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile fixes (faster)")
    ap.add_argument("--no-trace", action="store_true", help="skip the Kineto traces")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_memory_bound: needs a CUDA GPU", file=sys.stderr)
        return 2
    out_dir = args.out or Path(os.environ.get("OUT") or Path(__file__).resolve().parent / "results" / "memory_bound")
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    gpu = torch.cuda.get_device_name()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    version = f"torch {torch.__version__}"
    rows, table = [], []
    t0 = time.time()
    all_cases = cases(dev, not args.no_compile)
    for name, make, nbytes, provs, tol in all_cases:
        sets = [make(1000 + i) for i in range(_rotations(nbytes))]
        ref = provs["eager"](*sets[0])
        ref = ref.clone() if isinstance(ref, torch.Tensor) else ref
        eager_p50 = None
        for prov, fn in provs.items():
            try:
                got = fn(*sets[0])
                err = _rel(got.float(), ref.float()) if prov != "eager" else 0.0
                status = "ok" if err <= tol or prov == "eager" else f"wrong ({err:.2e} > {tol:g})"
                times = _time(fn, sets, args.reps) if status == "ok" else []
            except Exception as exc:  # a fix this torch cannot run: recorded, the run goes on
                err, status, times = float("nan"), f"error: {type(exc).__name__}: {str(exc)[:120]}", []
            p50 = _pct(times, 0.5) if times else float("nan")
            if prov == "eager":
                eager_p50 = p50
            for metric, unit, vals in (("time", "us", times),):
                rows.append({"case": name, "provider": prov, "metric": metric, "unit": unit,
                             "p50": f"{p50:.3f}", "p20": f"{_pct(times, 0.2):.3f}" if times else "",
                             "p80": f"{_pct(times, 0.8):.3f}" if times else "", "bytes": nbytes,
                             "rel_err": f"{err:.3e}", "status": status, "gpu": gpu, "timestamp": stamp,
                             "version": version})
            table.append((name, prov, p50, nbytes, eager_p50, status, err))
            print(f"{time.time() - t0:6.1f}s {name:32s} {prov:18s} {p50:10.1f} us  {status}", flush=True)
        del sets, ref
        torch.cuda.empty_cache()
    with open(out_dir / "memory_bound.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    copy_rate = next((nb / (p * 1e-6) for n, pv, p, nb, *_ in table if n == "reference_clone_bf16" and p == p), None)
    lines = [f"# Memory-bound kernels and their fixes ({gpu}, {stamp}, {version})", "",
             "p50 per call over rotating inputs; TB/s = compulsory bytes / p50; 'of copy' against the clone rate "
             "in this run.", "",
             "| case | provider | us | TB/s | of copy | vs eager | status |", "|---|---|---:|---:|---:|---:|---|"]
    for name, prov, p50, nbytes, eager_p50, status, err in table:
        rate = nbytes / (p50 * 1e-6) if p50 == p50 else float("nan")
        frac = rate / copy_rate if copy_rate else float("nan")
        speed = eager_p50 / p50 if p50 == p50 and eager_p50 else float("nan")
        lines.append(f"| {name} | {prov} | {p50:.1f} | {rate / 1e12:.2f} | {frac:.2f} | {speed:.2f}x | {status} |")
    (out_dir / "memory_bound.md").write_text("\n".join(lines) + "\n")
    if not args.no_trace:
        _traces(all_cases, out_dir)
    print(f"done in {time.time() - t0:.0f} s -> {out_dir}")
    return 0


def _traces(all_cases, out_dir: Path) -> None:
    """Two calls of every eager case in one Kineto trace, two of every fix in another."""
    from torch.profiler import ProfilerActivity, profile

    for which in ("eager", "fixed"):
        runs = []
        for name, make, nbytes, provs, tol in all_cases:
            if name.startswith("reference_"):
                continue
            args = make(7)
            for prov, fn in provs.items():
                if (prov == "eager") == (which == "eager"):
                    fn(*args)  # warm
                    runs.append((fn, args))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for fn, args in runs:
                for _ in range(2):
                    fn(*args)
            torch.cuda.synchronize()
        raw = out_dir / f"trace_{which}.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        del runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
