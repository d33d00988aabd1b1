"""Probe: what staging misaligned operands for TMA costs and buys (persistent_gemm.staged, H200).

    python3 experiments/probe_staging.py [--shapes 1664x1408x8196,2000x2900x8192,4096x4095x4096]

For shapes whose rows break TMA's 16-byte rule (K or N times the element size not a multiple
of 16), the TMA schedules copy the misfit operands into aligned buffers first
(persistent_gemm.stage_for_tma). This prints, per shape: the time of each staging copy, by
torch's copy_ into the padded view and by persistent_gemm.aligned_copy (checked equal); then
Stream-K's default config (staged where staging_pays) on a NaN-poisoned output, its error
against a float64 reference, and its time next to torch.matmul's. Eager do_bench medians (so
host launch cost is included), bf16, fresh random inputs.

Results (with device, date and commit) in experiments/results/staging/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import parse_shape


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1664x1408x8196,2000x2900x8192,4096x4095x4096")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("probe_staging: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from kernels import persistent_gemm as pg
    from kernels import stream_k_gemm as sk
    from kernels.common import TOLERANCE, reference, rel_error

    torch.manual_seed(0)
    bf16 = torch.bfloat16
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; do_bench medians (eager), bf16")
    for shape in args.shapes.split(","):
        M, N, K = parse_shape(shape)
        a = torch.randn(M, K, device="cuda", dtype=bf16)
        b = torch.randn(K, N, device="cuda", dtype=bf16)
        for name, x in (("A", a), ("B", b)):
            if pg.tma_layout(x) is not None:
                continue
            dst = pg.aligned_empty(*x.shape, x.dtype, x.device)
            t_torch = do_bench(lambda x=x, dst=dst: dst.copy_(x), warmup=20, rep=200)
            t_kern = do_bench(lambda x=x: pg.aligned_copy(x), warmup=20, rep=200)
            if not torch.equal(pg.aligned_copy(x), x):
                raise SystemExit(f"{shape}: aligned_copy of {name} differs from its source")
            gb = 2 * x.numel() * x.element_size() / 1e9
            print(f"{shape} stage {name} {tuple(x.shape)}: torch copy_ {t_torch * 1e3:.1f} us "
                  f"({gb / t_torch * 1e3:.0f} GB/s), aligned_copy {t_kern * 1e3:.1f} us ({gb / t_kern * 1e3:.0f} GB/s)")
        cfg = sk.default_config(M, N, K, bf16, 132)
        out = torch.full((M, N), float("nan"), device="cuda", dtype=bf16)
        sk.matmul(a, b, cfg, out=out)
        err = rel_error(out, reference(a, b))
        t_ours = do_bench(lambda cfg=cfg, a=a, b=b: sk.matmul(a, b, cfg), warmup=20, rep=300)
        t_torch = do_bench(lambda a=a, b=b: a @ b, warmup=20, rep=300)
        print(f"{shape} stream_k default ({cfg.describe()}): {t_ours * 1e3:.1f} us, rel err {err:.1e} "
              f"(tol {TOLERANCE[bf16]:.0e}); torch.matmul {t_torch * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
