"""GPU check: split-K launched as programmatic dependents (Config.pdl) stays correct when the
launches overlap, eagerly and replayed from a CUDA graph.

    python3 bench/check_pdl.py [--launches 48] [--variants bench/probes/skinny_pdl.json]

With `pdl`, a launch's programs may start while the previous kernel in the stream drains;
each waits (griddepcontrol.wait) before it touches memory. The danger is a program that
reads inputs or the pooled scratch (atomic sums, arrival counters) too early. So every pdl
config of the variants file runs `--launches` back-to-back calls over rotating inputs, each
into its own NaN-poisoned output, then the same sequence captured in a CUDA graph and
replayed twice; every output is compared with a float64 reference, and the pooled scratch
must be zero at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _run_all(sk, cfg, sets, outs) -> None:
    for i, o in enumerate(outs):
        sk.matmul(*sets[i % len(sets)], cfg, out=o)


def _worst(sets, refs, outs) -> float:
    import torch

    from kernels.common import rel_error

    torch.cuda.synchronize()
    return max(rel_error(o, refs[i % len(sets)]) for i, o in enumerate(outs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=48)
    ap.add_argument("--variants", type=Path, default=Path(__file__).parent / "probes" / "skinny_pdl.json")
    args = ap.parse_args()
    import torch

    from kernels import split_k_gemm as sk
    from kernels.common import SCRATCH, TOLERANCE, poison_, random_inputs, reference

    spec = json.loads(args.variants.read_text())
    failures = 0
    for v in spec["variants"]:
        if v["schedule"] != "split_k_gemm" or not v["config"].get("pdl"):
            continue
        cfg = sk.Config(**v["config"])
        for shape in v.get("shapes") or spec["shapes"]:
            M, N, K = (int(x) for x in shape.split("x"))
            sets = [random_inputs(M, N, K, torch.bfloat16, "cuda", seed=i) for i in range(4)]
            refs = [reference(a, b) for a, b in sets]
            outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(args.launches)]

            for o in outs:
                poison_(o)
            _run_all(sk, cfg, sets, outs)
            eager = _worst(sets, refs, outs)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _run_all(sk, cfg, sets, outs)
            replayed = []
            for _ in range(2):
                for o in outs:
                    poison_(o)
                graph.replay()
                replayed.append(_worst(sets, refs, outs))
            dirty = [name for name, buf in SCRATCH._buffers.items() if bool(buf.any())]
            ok = max(eager, *replayed) <= TOLERANCE[torch.bfloat16] and not dirty
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {cfg.describe()} {shape}: worst rel err eager {eager:.2e}, "
                  f"graph {max(replayed):.2e} over {args.launches} launches; dirty scratch: {dirty or '-'}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
