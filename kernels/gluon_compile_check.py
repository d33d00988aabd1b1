"""Compile cluster_gemm (kernels/gluon_gemm.py, Gluon) for sm_90a on a machine without a GPU;
with --split-kv, split_kv_gluon (decode attention) instead.

Run it under Triton >= 3.9 (here: a separate process with PYTHONPATH=/tmp/triton39; the main
environment's Triton 3.6 has no cluster Gluon):

    PYTHONPATH=/tmp/triton39:. python -m kernels.gluon_compile_check [--shapes 4096x4096x8192 ...]

Each config of the search space (and the default) is compiled through the schedule's own host
`matmul` with CPU tensors while a stand-in driver reports an sm_90 target and every launch is a
compile-only warmup. Printed per kernel: shared memory, registers, spills (cuobjdump), and what
the PTX holds: wgmma, multicast TMA (`.multicast::cluster`), a cluster launch (`.reqnctapercluster`
or `.explicitcluster`), setmaxnreg (warp specialization's register split). Exit 1 on a failure
or a config that over-fills shared memory. Compile-only: it proves the configs build, not that
they are right or fast (bench/bench_cluster_gemm.py does that on the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path


def ptx_features(ptx: str) -> dict:
    return {
        "wgmma": "wgmma.mma_async" in ptx,
        "multicast": bool(re.search(r"cp\.async\.bulk\.tensor[^;]*multicast::cluster", ptx)),
        "tma_load": "cp.async.bulk.tensor" in ptx,
        "tma_store": bool(re.search(r"cp\.async\.bulk\.tensor[^;]*global\.shared", ptx)),
        "cluster": bool(re.search(r"\.reqnctapercluster|\.explicitcluster|%cluster_ctarank", ptx)),
        "setmaxnreg": "setmaxnreg" in ptx,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=["4096x4096x8192", "1664x1408x8192", "1000x1304x776"])
    parser.add_argument("--dtypes", nargs="*", default=["bfloat16"])
    parser.add_argument("--default-only", action="store_true")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--dump-ptx", default=None, help="write each kernel's PTX into this folder")
    parser.add_argument("--split-kv", action="store_true",
                        help="instead: split_kv_gluon (decode attention) on the shapes and dtypes it takes")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ["ADVISOR_COMPILE_ONLY"] = "1"
    os.environ.setdefault("ADVISOR_NUM_SMS", "132")

    import torch
    import triton
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from kernels import gluon_gemm as mod
    from tools.sm90_compile_check import SM90_SMEM, _resource_usage, _Sm90Driver

    if args.split_kv:
        return _split_kv(driver, JITFunction, _Sm90Driver, _resource_usage, SM90_SMEM)
    why = mod.unavailable_reason()
    if why:
        print(why)
        return 2
    print(f"triton {triton.__version__}")
    driver.set_active(_Sm90Driver())
    compiled = []
    original_run = JITFunction.run

    def compile_only(self, *a, grid, warmup, **kw):
        kernel = original_run(self, *a, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only
    rows, failures = [], 0
    seen = set()
    try:
        for shape in args.shapes:
            M, N, K = (int(x) for x in shape.split("x"))
            for dname in args.dtypes:
                dtype = getattr(torch, dname)
                configs = [] if args.default_only else list(mod.search_space(M, N, K, dtype, 132))
                d = mod.default_config(M, N, K, dtype, 132)
                if d not in configs:
                    configs.append(d)
                for cfg in configs:
                    a = torch.empty((M, K), dtype=dtype)
                    b = torch.empty((K, N), dtype=dtype)
                    compiled.clear()
                    try:
                        mod.matmul(a, b, cfg)
                    except Exception as exc:  # noqa: BLE001  (report each failing config, exit 1)
                        failures += 1
                        msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600]
                        print(f"FAIL  {shape:16s} {dname:8s} {cfg.describe():34s} {msg}")
                        rows.append({"shape": shape, "dtype": dname, "config": cfg.as_dict(), "ok": False, "error": msg})
                        continue
                    for kname, kernel in compiled:
                        if kernel.hash in seen:
                            continue
                        seen.add(kernel.hash)
                        res = _resource_usage(kernel.asm["cubin"])
                        ptx = kernel.asm["ptx"]
                        feats = ptx_features(ptx)
                        smem = kernel.metadata.shared
                        bad = smem > SM90_SMEM
                        failures += bad
                        if args.dump_ptx:
                            Path(args.dump_ptx).mkdir(parents=True, exist_ok=True)
                            (Path(args.dump_ptx) / f"{kname}_{cfg.describe().replace(' ', '_')}.ptx").write_text(ptx)
                        flags = " ".join(k for k, v in feats.items() if v)
                        print(f"{'FAIL' if bad else 'ok':5s} {shape:16s} {dname:8s} {cfg.describe():34s} {kname:18s} "
                              f"smem={smem // 1024:3d}KB regs={res['regs']:3d} stack={res['stack']} [{flags}]")
                        rows.append({"shape": shape, "dtype": dname, "config": cfg.as_dict(), "kernel": kname,
                                     "ok": not bad, "smem": smem, **res, **feats})
    finally:
        JITFunction.run = original_run
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"{failures} failure(s)")
    return 1 if failures else 0


# (B, Hq, Hkv, Lq, S, D, dtype name, K/V cache length: a longer cache sliced to S keys)
SPLIT_KV_CASES = [(2, 32, 8, 1, 32768, 128, "bfloat16", 32768), (1, 32, 8, 4, 1000, 64, "float16", 1000),
                  (4, 64, 8, 8, 8193, 128, "bfloat16", 9000), (3, 28, 4, 1, 20000, 128, "float16", 20000),
                  (1, 8, 1, 1, 300000, 64, "bfloat16", 300000)]  # one kv head, long: 469 splits to combine


def _split_kv(driver, JITFunction, Sm90Driver, resource_usage, smem_limit) -> int:
    """Build split_kv_gluon's kernels for each SPLIT_KV_CASES entry at both stage counts
    (`supports` bypassed: there is no GPU to ask), through its own host `decode_attention`."""
    import torch

    from kernels import split_kv_gluon as g

    if g._WHY:
        print(g._WHY)
        return 2
    driver.set_active(Sm90Driver())
    original, built, failures = JITFunction.run, [], 0

    def compile_only(self, *a, grid, warmup, **kw):
        kernel = original(self, *a, grid=grid, warmup=True, **kw)
        built.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run, g.supports = compile_only, (lambda q, k, v: None)
    try:
        for B, Hq, Hkv, Lq, S, D, dname, cache in SPLIT_KV_CASES:
            dtype = getattr(torch, dname)
            q = torch.empty((B, Hq, Lq, D), dtype=dtype)
            k = torch.empty((B, Hkv, cache, D), dtype=dtype)[:, :, :S]
            for stages, combine in ((3, "kernel"), (4, "kernel"), (3, "last_arriver"), (4, "last_arriver")):
                built.clear()
                case = f"{B}x{Hq}x{Hkv}x{Lq}x{S}x{D} {dname} cache {cache} stages {stages} {combine}"
                try:
                    g.decode_attention(q, k, k, sms=132, stages=stages, combine=combine)
                except Exception as exc:  # noqa: BLE001  (report each failing case, exit 1)
                    failures += 1
                    print(f"FAIL  {case}: {type(exc).__name__}: {str(exc)[:600]}".replace("\n", " "))
                    continue
                for name, kernel in built:
                    res, smem, ptx = resource_usage(kernel.asm["cubin"]), kernel.metadata.shared, kernel.asm["ptx"]
                    failures += smem > smem_limit
                    flags = " ".join(k for k, v in ptx_features(ptx).items() if v)
                    print(f"{'FAIL' if smem > smem_limit else 'ok':5s} {case:64s} {name:16s} smem={smem // 1024:3d}KB "
                          f"regs={res['regs']:3d} stack={res['stack']} [{flags}]")
    finally:
        JITFunction.run = original
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
