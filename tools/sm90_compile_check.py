"""Compile every config of a schedule's search space (and its default) for sm_90, without a GPU.

Why
    Device time is scarce; a config that fails to compile or to launch on sm_90 ("out of
    resources: shared memory", a ptxas error) wastes a GPU batch. Triton's wheel carries
    ptxas, so the whole pipeline (Triton IR -> PTX -> cubin for sm_90a) runs on the CPU. This
    tool drives each schedule's real host `matmul` with CPU tensors while a stand-in driver
    reports an sm_90 target and every launch is turned into a compile-only warmup, then reads
    each kernel's shared memory from Triton's metadata and its registers/spills from
    `cuobjdump --dump-resource-usage`.

Usage (repository root, TRITON_INTERPRET unset)
    python -m tools.sm90_compile_check dp_gemm split_k_gemm --shapes 8192x8192x8192
    python -m tools.sm90_compile_check --all
    python -m tools.sm90_compile_check --all --default-only --shapes 1280x1280x4096
    python -m tools.sm90_compile_check --variants experiments/probes/tail_split_m.json
    python -m tools.sm90_compile_check --split-kv      (decode attention: the bench's shapes)

Caveats
    Compile-only: it proves the configs build and fit in 227 KB of shared memory (a failure
    otherwise) and reports register spills (local-memory stack > 0: slow, not fatal; seen
    only where a leading stride is not a multiple of 16 elements, which costs Triton its
    vectorized loads), not that they are fast or correct. Run it with TRITON_INTERPRET
    unset; it imports the schedules itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SM90_SMEM = 232448  # bytes of opt-in shared memory per block (227 KB)


class _Sm90Driver:
    """Just enough of Triton's driver interface to compile for sm_90 without a GPU."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self._target = GPUTarget("cuda", 90, 32)

    def is_active(self):
        return True

    def get_current_target(self):
        return self._target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_benchmarker(self):
        raise RuntimeError("compile-only driver")

    def get_device_interface(self):
        raise RuntimeError("compile-only driver")


def _resource_usage(cubin: bytes) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401  (ensures the wheel layout)

    tool = Path(importlib.import_module("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return {"regs": int(regs.group(1)) if regs else -1, "stack": int(stack.group(1)) if stack else -1}


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: this tool compiles real kernels", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("schedules", nargs="*", default=[])
    parser.add_argument("--all", action="store_true", help="dp, split-k, persistent and stream-k")
    parser.add_argument("--shapes", nargs="*", default=None, help="MxNxK ... (default: the issue's suites)")
    parser.add_argument("--dtypes", nargs="*", default=None,
                        help="torch dtype names (default: bfloat16 float16 float32; with --variants, bfloat16)")
    parser.add_argument("--transposed", action="store_true", help="also compile with a transposed A and B")
    parser.add_argument("--default-only", action="store_true",
                        help="only each schedule's default config (what matmul(a, b) runs), not its search space")
    parser.add_argument("--variants", default=None,
                        help="a experiments/probe_configs.py variants file: compile exactly its configs on its shapes "
                             "(bf16 unless --dtypes says otherwise), before spending device time on them")
    parser.add_argument("--split-kv", action="store_true",
                        help="split_kv_attention: the search space of bench/bench_split_kv.py's shapes and odd ones")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.split_kv:
        return _compile_split_kv()
    if args.variants:
        return _check_variants(args.variants, args.dtypes or ["bfloat16"], args.transposed)

    import torch

    schedules = args.schedules or []
    if args.all:
        schedules = ["dp_gemm", "split_k_gemm", "persistent_gemm", "stream_k_gemm"]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes else [
        (8192, 8192, 8192), (4096, 4096, 8192), (1664, 1408, 8192), (4224, 4224, 8192),
        (16, 4096, 16384), (256, 256, 131072), (32, 32, 131072), (128, 8192, 8192), (37, 53, 97)]
    jobs = []
    for name in schedules:
        mod = _load(name)
        for (M, N, K) in shapes:
            for dname in args.dtypes or ["bfloat16", "float16", "float32"]:
                dtype = getattr(torch, dname)
                default = mod.default_config(M, N, K, dtype, 132)
                configs = [] if args.default_only else list(mod.search_space(M, N, K, dtype, 132))
                if default not in configs:
                    configs.append(default)
                jobs += [(name, mod, (M, N, K), dname, cfg) for cfg in configs]
    return _compile_all(jobs, args.transposed)


def _load(name: str):
    """A schedule module of kernels/ by file name (main has put the repository root on
    sys.path); no advisor import, so the tool runs wherever the kernels do."""
    return importlib.import_module(f"kernels.{name}")


def _check_variants(path: str, dtypes: list[str], transposed: bool) -> int:
    """The configs of a probe's variants file, each on its shapes (the file's, or its own)."""
    import json

    spec = json.loads(Path(path).read_text())
    jobs = []
    for v in spec["variants"]:
        mod = _load(v["schedule"])
        cfg = mod.Config(**v["config"])
        for shape in v.get("shapes") or spec["shapes"]:
            jobs += [(v["schedule"], mod, tuple(int(x) for x in shape.split("x")), d, cfg) for d in dtypes]
    return _compile_all(jobs, transposed)


def _compile_split_kv() -> int:
    """Every config of split_kv_attention's search space on the decode bench's shapes (bf16, 32
    query / 8 kv heads, D 128), every kernel of the bench's --sweep, and the default config on odd ones (fp16 Lq 4, D 256, fp32,
    MQA with 16 query positions, D 96), compiled through decode_attention for sm_90."""
    import torch

    mod = _load("split_kv_attention")
    jobs = []
    for B in (1, 8):
        for S in (8192, 131072):
            jobs += [((B, 32, 8, 1, S, 128), torch.bfloat16, c) for c in mod.search_space(B, 32, 8, 1, S, 128, torch.bfloat16, 132)]
    # every kernel bench/bench_split_kv.py --sweep can launch: its structures x combine x PDL
    tuning = _load("split_kv_tuning")
    for knobs in tuning.balance_candidates(tuning.structure_candidates(128, 2)):
        if knobs["programs_per_sm"] == 2:
            jobs.append(((1, 32, 8, 1, 8192, 128), torch.bfloat16,
                         mod.Config(**tuning.candidate_knobs(8, 8192, 132, knobs))))
    for shape, dtype in (((2, 32, 8, 4, 8192, 128), torch.float16), ((1, 8, 8, 1, 8192, 256), torch.bfloat16),
                         ((1, 32, 8, 1, 8192, 128), torch.float32), ((1, 64, 1, 16, 4096, 64), torch.bfloat16),
                         ((1, 8, 2, 1, 4096, 96), torch.bfloat16)):
        jobs.append((shape, dtype, mod.default_config(*shape, dtype, 132)))

    def call(shape, dtype, cfg):
        B, Hq, Hkv, Lq, S, D = shape
        q = torch.empty((B, Hq, Lq, D), dtype=dtype)
        k = torch.empty((1, Hkv, S, D), dtype=dtype).expand(B, Hkv, S, D)  # no host memory per batch
        mod.decode_attention(q, k, k, cfg)

    return _compile_calls([("split_kv_attention", "x".join(map(str, shape)), str(dtype)[6:], cfg,
                            lambda s=shape, d=dtype, c=cfg: call(s, d, c)) for shape, dtype, cfg in jobs])


def _compile_calls(calls: list) -> int:
    """Run each (schedule, shape text, dtype name, config, call) with launches turned into sm_90
    compiles; print registers, shared memory and spills a kernel (as _compile_all)."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_Sm90Driver())
    compiled: list = []
    original_run = JITFunction.run

    def compile_only(self, *a, grid, warmup, **kw):
        kernel = original_run(self, *a, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only
    os.environ["TRITON_INTERPRET"] = "1"  # lets the input checks accept the CPU tensors
    failures = spills = 0
    seen = set()
    try:
        for name, shape, dname, cfg, fn in calls:
            compiled.clear()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001  (report every failing config, then exit 1)
                failures += 1
                print(f"FAIL {name} {shape} {dname} {cfg.describe()}: {type(exc).__name__}: {exc}")
                continue
            for kname, kernel in compiled:
                if kernel.hash in seen:
                    continue
                seen.add(kernel.hash)
                res = _resource_usage(kernel.asm["cubin"])
                smem = kernel.metadata.shared
                bad = smem > SM90_SMEM
                spills += res["stack"] > 0
                failures += bad
                label = "FAIL" if bad else ("SPILL" if res["stack"] > 0 else "ok")
                print(f"{label:5s} {name:18s} {kname:24s} {shape:22s} {dname:8s} {cfg.describe():48s} "
                      f"smem={smem // 1024:3d}KB regs={res['regs']:3d} stack={res['stack']}")
    finally:
        JITFunction.run = original_run
        driver._active = None
    print(f"{failures} failure(s), {spills} kernel(s) spilling registers")
    return 1 if failures else 0


def _compile_all(jobs: list, transposed: bool) -> int:
    """Compile each (schedule, module, shape, dtype, config) job for sm_90 through the
    schedule's own host matmul; print registers, shared memory and spills a kernel."""
    import torch
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_Sm90Driver())
    compiled: list = []
    original_run = JITFunction.run

    def compile_only(self, *a, grid, warmup, **kw):
        kernel = original_run(self, *a, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only
    os.environ["TRITON_INTERPRET"] = "1"  # lets check_matmul_inputs accept the CPU tensors
    os.environ.setdefault("ADVISOR_NUM_SMS", "132")
    failures = spills = 0
    seen = set()
    layouts = [(False, False), (True, True)] if transposed else [(False, False)]
    try:
        for name, mod, (M, N, K), dname, cfg in jobs:
            dtype = getattr(torch, dname)
            for ta, tb in layouts:
                a = torch.empty((K, M) if ta else (M, K), dtype=dtype)
                b = torch.empty((N, K) if tb else (K, N), dtype=dtype)
                a, b = (a.t() if ta else a), (b.t() if tb else b)
                compiled.clear()
                try:
                    mod.matmul(a, b, cfg)
                except Exception as exc:  # noqa: BLE001  (report every failing config, then exit 1)
                    failures += 1
                    print(f"FAIL {name} {M}x{N}x{K} {dname} {cfg.describe()}: {type(exc).__name__}: {exc}")
                    continue
                for kname, kernel in compiled:
                    key = kernel.hash
                    if key in seen:
                        continue
                    seen.add(key)
                    res = _resource_usage(kernel.asm["cubin"])
                    ptx = kernel.asm["ptx"]
                    mma = "wgmma" if "wgmma" in ptx else ("mma" if "mma.sync" in ptx else "none")
                    smem = kernel.metadata.shared
                    bad = smem > SM90_SMEM
                    spills += res["stack"] > 0
                    failures += bad
                    label = "FAIL" if bad else ("SPILL" if res["stack"] > 0 else "ok")
                    print(f"{label:5s} {name:16s} {kname:24s} {M}x{N}x{K} {dname:8s} "
                          f"{cfg.describe():40s} smem={smem // 1024:3d}KB regs={res['regs']:3d} "
                          f"stack={res['stack']} {mma}")
    finally:
        JITFunction.run = original_run
        driver._active = None  # the next use of Triton's driver looks for a real GPU again
    print(f"{failures} failure(s), {spills} kernel(s) spilling registers")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
