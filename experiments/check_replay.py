"""GPU correctness of replayed calls (kernels/runtime.py: Recorder, replay) for every schedule
that records them: dp_gemm, split_k_gemm, persistent_gemm, stream_k_gemm and ws_gemm.

    python3 experiments/check_replay.py

A replayed call launches the kernels its first call made, with the new call's tensors put
into the recorded arguments. So each case: one recording call, then three calls on fresh
random inputs (new addresses) into NaN-poisoned outputs, each of which must be a replay
(REPLAYS.replayed counts them) and match a float64 reference within the dtype's tolerance;
for deterministic configs the replayed result must also be bit-identical to the schedule's
own path (replays off) on the same inputs. Cases cover TMA descriptors (row- and
column-major operands), pointer loads, atomic, fixup, two-phase and deterministic
reductions, the Stream-K tail options (row pieces, TMA hand-in, the ragged column first),
new, row-major and column-major outputs, three dtypes, and calls that must not be replayed
(ws_gemm's device-side descriptors, staged operands); then two calls alternating between
keys, with replays captured in a CUDA graph. Prints one line a case and the failure count;
exits 1 on any failure.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cases():
    import torch

    from kernels import dp_gemm as dp
    from kernels import persistent_gemm as pg
    from kernels import split_k_gemm as skg
    from kernels import stream_k_gemm as sk
    from kernels import ws_gemm as ws

    sk_split_m = sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", False, aligned=True, use_tma=True, SK_SPLIT_M=2)
    sk_hand_in = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", False, aligned=True, use_tma=True, tma_hand_in=True)
    sk_edge = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", False, aligned=True, use_tma=True, SK_SPLIT_N=2,
                        SK_STAGES=5, edge_first=True)
    sk_det = sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", True, aligned=True, use_tma=True)
    sk_ptr = sk.Config(128, 128, 64, 8, 4, 4, "hybrid1", True)
    ws_host = ws.Config(128, 256, 64, 8, 8, 4, warp_specialize=False, host_descriptors=True, epilogue_subtile=2,
                        tma_store=True)
    ws_dev = ws.Config(128, 128, 64, 8, 4, 4, warp_specialize=False, host_descriptors=False)
    bf, all3 = (torch.bfloat16,), (torch.bfloat16, torch.float16, torch.float32)
    # (name, module, config or None (the default), M, N, K, transpose_a, transpose_b, out kind
    # ("new": the schedule allocates C, "col": a column-major `out`, "out": a row-major one),
    # dtypes[, replayed]): explicit configs in bf16 (their tiles are sized for 2-byte
    # elements), defaults in all three where K is short enough for fp32
    return [
        ("dp default", dp, None, 37, 53, 97, False, False, "new", all3),
        ("dp default, A^T", dp, None, 1664, 1408, 1024, True, False, "out", bf),
        ("split_k atomic", skg, skg.Config(32, 32, 128, 8, 4, 6, SPLIT_K=128, reduction="atomic"),
         32, 32, 131072, False, False, "out", bf),
        ("split_k fixup", skg, skg.Config(16, 64, 128, 8, 4, 6, SPLIT_K=2, reduction="fixup"),
         16, 4096, 16384, False, False, "new", bf),
        ("split_k two_phase", skg, skg.Config(128, 128, 64, 8, 4, 5, SPLIT_K=32, reduction="two_phase"),
         256, 256, 131072, False, True, "new", bf),
        ("split_k default odd", skg, None, 37, 53, 3000, False, False, "col", all3),
        ("persistent default", pg, None, 1536, 2048, 1024, False, False, "new", all3),
        ("persistent default, B^T", pg, None, 1536, 2048, 1024, False, True, "out", bf),
        ("persistent pointer loads", pg, replace(pg.default_config(1536, 2048, 1024, torch.bfloat16, 132),
                                                 use_tma=False, EPILOGUE_SUBTILE=False),
         1536, 2048, 1024, True, False, "col", bf),
        ("stream_k default", sk, None, 1664, 1408, 8192, False, False, "new", (torch.bfloat16, torch.float16)),
        ("stream_k default, A^T", sk, None, 1664, 1408, 2048, True, False, "new", bf),
        ("stream_k split_m atomic", sk, sk_split_m, 1664, 1408, 8192, False, False, "out", bf),
        ("stream_k tma hand-in", sk, sk_hand_in, 3072, 3072, 1024, False, False, "new", bf),
        ("stream_k edge first", sk, sk_edge, 2176, 2176, 2048, False, False, "new", bf),
        ("stream_k deterministic", sk, sk_det, 2304, 2304, 1024, False, False, "new", bf),
        ("stream_k pointer loads", sk, sk_ptr, 1000, 1000, 1000, False, False, "col", bf),
        ("stream_k default skinny", sk, None, 256, 256, 131072, False, False, "new", bf),
        ("stream_k default odd", sk, None, 37, 53, 97, False, False, "new", all3),
        # fp32 with a row-major B on pointer loads: the call swaps (C^T = B^T A^T, B^T through
        # registers; kernels/tf32_layout.py) and the swapped inner call is what replays
        ("stream_k fp32 swap point", sk, sk.Config(256, 128, 32, 8, 8, 3, "hybrid1", False, aligned=True),
         2304, 2304, 1024, False, False, "new", (torch.float32,)),
        ("stream_k fp32 swap point, col out", sk, sk.Config(256, 128, 32, 8, 8, 3, "hybrid1", False, aligned=True),
         2304, 2304, 1024, False, False, "col", (torch.float32,)),
        ("persistent fp32 pointer, swapped", pg, pg.Config(256, 128, 32, 8, 8, 3, 1, False, False, False),
         1536, 2048, 1024, False, False, "out", (torch.float32,)),
        ("split_k fp32 wide, swapped", skg, skg.Config(256, 128, 32, 8, 8, 4, SPLIT_K=16, reduction="two_phase"),
         512, 512, 8192, False, False, "new", (torch.float32,)),
        ("ws host descriptors", ws, ws_host, 1664, 1408, 2048, False, False, "new", bf),
        ("ws host descriptors, B^T", ws, ws_host, 1664, 1408, 2048, False, True, "out", bf),
        # not replayed: device-side descriptors need per-launch scratch; K = 2052 rows break
        # TMA's 16-byte rule, so A and B are staged through copies
        ("ws device descriptors", ws, ws_dev, 1664, 1408, 2048, False, False, "new", bf, False),
        ("ws staged operands", ws, ws_host, 1000, 1000, 2052, False, False, "new", bf, False),
    ]


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("check_replay: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels.common import TOLERANCE, poison_, random_inputs, rel_error
    from kernels.runtime import REPLAYS

    def ref_of(a, b):
        return (a.double() @ b.double()).cpu()

    def new_out(kind, M, N, dtype):
        if kind == "col":
            return torch.full((N, M), float("nan"), device="cuda", dtype=dtype).t()
        if kind == "out":
            return torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        # the schedule allocates C: free a NaN block of its size first, which the caching
        # allocator then hands to that allocation
        torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
        return None

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    bad = 0
    for name, mod, cfg, M, N, K, ta, tb, out_kind, dtypes, *expect in cases():
        replayed = expect[0] if expect else True
        for dtype in dtypes:
            resolved = cfg or mod.default_config(M, N, K, dtype, 132)
            # atomic reductions add in arrival order: the same result only within tolerance
            det = getattr(resolved, "deterministic", True) and getattr(resolved, "reduction", "") != "atomic"
            REPLAYS.clear()
            tol = TOLERANCE[dtype]
            errs, notes = [], []
            a, b = random_inputs(M, N, K, dtype, "cuda", transpose_a=ta, transpose_b=tb)
            out = new_out(out_kind, M, N, dtype)
            errs.append(rel_error(mod.matmul(a, b, cfg, out=out), ref_of(a, b)))
            before = REPLAYS.replayed
            recorded = bool(REPLAYS.calls)
            for _ in range(3):
                a, b = random_inputs(M, N, K, dtype, "cuda", transpose_a=ta, transpose_b=tb)
                out = new_out(out_kind, M, N, dtype)
                got = mod.matmul(a, b, cfg, out=out)
                errs.append(rel_error(got, ref_of(a, b)))
                if det:  # the schedule's own path on the same inputs: the same bits
                    REPLAYS.enabled = False
                    own = mod.matmul(a, b, cfg, out=new_out(out_kind, M, N, dtype))
                    REPLAYS.enabled = True
                    if not torch.equal(own, got):
                        notes.append("replay differs from the own path")
            replays = REPLAYS.replayed - before
            if replayed and (not recorded or replays != 3):
                notes.append(f"recorded={recorded} replays={replays}/3")
            if not replayed and (recorded or replays):
                notes.append(f"replayed a call that must not be ({replays} replays)")
            ok = max(errs) <= tol and not notes
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name:26s} {dtype!s:14s} {M}x{N}x{K} ta={ta:d} tb={tb:d} out={out_kind} "
                  f"max rel err {max(errs):.1e} {' '.join(notes)}")

    # two keys alternating, then replays captured in a CUDA graph (rotating buffers)
    from kernels import split_k_gemm as skg
    from kernels import stream_k_gemm as sk

    REPLAYS.clear()
    sets = [[random_inputs(M, N, K, torch.bfloat16, "cuda") for _ in range(3)]
            for M, N, K in ((1664, 1408, 4096), (16, 4096, 16384))]
    fns = (sk.matmul, skg.matmul)
    for f, ins in zip(fns, sets):
        f(*ins[0])  # record
    outs = [[torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.bfloat16) for a, b in ins] for ins in sets]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f, ins, os_ in zip(fns, sets, outs):  # warm the capture stream's scratch
            f(*ins[0], out=os_[0])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(3):
            for f, ins, os_ in zip(fns, sets, outs):
                f(*ins[i], out=os_[i])
    for os_ in outs:
        for o in os_:
            poison_(o)
    graph.replay()
    torch.cuda.synchronize()
    errs = [rel_error(o, ref_of(a, b)) for ins, os_ in zip(sets, outs) for (a, b), o in zip(ins, os_)]
    ok = max(errs) <= TOLERANCE[torch.bfloat16] and REPLAYS.replayed >= 8
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} alternating keys in a CUDA graph: max rel err {max(errs):.1e}, "
          f"{REPLAYS.replayed} replays")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
