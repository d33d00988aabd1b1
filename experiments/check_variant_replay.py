"""GPU check: generated variants (advisor.codegen.generate) use advisor's kernels/runtime.py through
their runtime_plain section when advisor is importable; do their replayed calls engage, and
stay correct?

    python3 experiments/check_variant_replay.py

Generates one variant per GEMM strategy into a temporary folder (the model's knobs, as
`advisor generate` writes them), imports each, and calls its `variant_matmul` three times on
fresh random inputs: the first call records, the other two must replay (advisor's
runtime's REPLAYS counts them) and match a float64 reference within the bf16 tolerance. Strategies
whose default kernel needs per-launch scratch (warp specialization with device-side
descriptors) must record nothing. Prints one line a strategy; exits 1 on any failure.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = (("stream_k", 1664, 1408, 8192), ("split_k", 32, 32, 131072), ("persistent", 4096, 4096, 8192),
         ("warp_specialization", 1664, 1408, 8192), ("dp", 1024, 1024, 1024))


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("check_variant_replay: needs a CUDA GPU", file=sys.stderr)
        return 2
    from advisor.codegen.generate import generate
    from advisor.codegen.kernel_lib import load
    from kernels.common import TOLERANCE, rel_error

    REPLAYS = load("runtime").REPLAYS  # a variant's runtime_plain uses advisor's runtime (its keys its own)

    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for strategy, M, N, K in CASES:
            path = Path(tmp) / f"v_{strategy}.py"
            generate(strategy, M, N, K, "bf16", path=path)
            spec = importlib.util.spec_from_file_location(path.stem, path)
            m = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = m  # dataclasses look their module up there
            spec.loader.exec_module(m)
            before = (REPLAYS.recorded, REPLAYS.replayed)
            errs = []
            for _ in range(3):
                a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
                errs.append(rel_error(m.variant_matmul(a, b), (a.double() @ b.double()).cpu()))
            needs_scratch = not getattr(m.CONFIG, "host_descriptors", True)
            want = (0, 0) if needs_scratch else (1, 2)
            got = (REPLAYS.recorded - before[0], REPLAYS.replayed - before[1])
            ok = got == want and max(errs) <= TOLERANCE[torch.bfloat16]
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {strategy:20s} {M}x{N}x{K}: recorded {got[0]}, replayed {got[1]} of the "
                  f"two later calls (expected {want[1]}), max rel err {max(errs):.1e}")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
