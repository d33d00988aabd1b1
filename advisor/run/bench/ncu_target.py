"""The program `advisor --counters` runs under Nsight Compute: one provider, one shape, one call.

    python -m advisor.run.bench.ncu_target --shape 1664x1408x8192 --dtype bf16 \
        --provider stream_k --config '{"BLOCK_M": 128, ...}'

It compiles and warms the provider up first (ncu starts with --profile-from-start off, so
compilation and warm-up are not profiled), checks the result against torch.matmul in fp32,
then opens the profiler (cudaProfilerStart) around exactly one call inside an NVTX range
named after the provider, and prints one JSON line. Exit code 1 when the result is wrong:
counters of a wrong kernel explain nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="MxNxK")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--provider", required=True, help="torch.matmul, dp, split_k, persistent, stream_k, warp_specialization")
    ap.add_argument("--config", default=None, help="the schedule's Config as JSON (omit for its default)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)

    import torch

    from .runner import call_flex, load_schedule, schedule_call, torch_call
    from .verify import dtype_from_name, make_generator, random_matrix, relative_error, tolerance
    from .worker import rebuild_config

    M, N, K = (int(x) for x in args.shape.lower().split("x"))
    dtype = dtype_from_name(args.dtype)
    dev = torch.device(args.device)
    g = make_generator(dev, args.seed)
    a, b = random_matrix(M, K, dtype, dev, g), random_matrix(K, N, dtype, dev, g)
    if args.provider == "torch.matmul":
        fn = torch_call(dtype)
    else:
        mod = load_schedule(args.provider)
        cfg = rebuild_config(mod, args.config) if args.config else None
        if cfg is None:
            sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
            cfg = call_flex(mod.default_config, M, N, K, dtype, sms)
        fn = schedule_call(mod, cfg)
    out = torch.full((M, N), float("nan"), dtype=dtype, device=dev)
    for _ in range(max(1, args.warmup)):
        got = fn(a, b, out)
    ref = torch.matmul(a.float(), b.float())
    err = relative_error(got if got is not None else out, ref)
    if not math.isfinite(err) or err > tolerance(dtype):
        print(json.dumps({"ok": False, "provider": args.provider, "rel_err": err}))
        return 1
    out.fill_(float("nan"))
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(f"advisor {args.provider} {M}x{N}x{K}") if cuda else None
    fn(a, b, out)
    if cuda:
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize(dev)
        torch.cuda.profiler.stop()
    print(json.dumps({"ok": True, "provider": args.provider, "rel_err": err}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
