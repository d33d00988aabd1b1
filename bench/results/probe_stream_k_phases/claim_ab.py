# Ad-hoc A/B of the claim atomic's memory order (not a maintained probe): runs only at the commit that added it,
# where stream_k_gemm had the experimental _CLAIM_SEM switch. Run from the repository root with PYTHONPATH=$PWD.
import sys, statistics
sys.path.insert(0, "bench")
from probe_configs import time_side_by_side, schedule_call
from advisor.kernel_lib import load
sk = load("stream_k_gemm")
t5 = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=5, policy="hybrid1", aligned=True, use_tma=True)
w3 = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, policy="hybrid1", aligned=True, use_tma=True)
w4 = dict(w3, num_stages=4, EPILOGUE_SUBTILE=True)
def call(cfg, sem):
    def f(a, b, out):
        sk._CLAIM_SEM = sem
        return sk.matmul(a, b, cfg, out=out)
    return f
for shape, base in [("1664x1408x8192", t5), ("2176x2176x8192", t5), ("2304x2304x4096", t5), ("3072x3072x4096", w3), ("4224x4224x8192", w4)]:
    cfg = sk.Config(**base)
    todo = [("cublas", "torch.matmul", schedule_call(None, None))]
    todo += [(sem, f"{cfg.describe()} {sem}", call(cfg, sem)) for sem in ("acq_rel", "acquire")]
    res = time_side_by_side(shape, todo, 5, 40)
    base_us = statistics.median(res[0][3])
    for key, label, err, med in res:
        m = statistics.median(med)
        print(f"{shape:>16} {label:<55} {m:7.1f} us  x{base_us / m:.3f} cuBLAS  rounds {[round(x, 1) for x in med]}  err {err:.1e}", flush=True)
