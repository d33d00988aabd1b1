"""Shared basics: the dtypes and strategy ids `advisor generate` takes, the one shape parser,
and the margin a measured winner must clear.

Every layer (diagnosis, code generation, the --run loop, the report templates, the bench
scripts) reads these, so they live here and not in a feature module: this module imports
nothing of advisor's but `errors`, and any module may import it without making a cycle.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from .errors import AdvisorError

# The dtypes our kernels take -> element size in bytes.
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
# ... and the name of each as a torch attribute (torch.bfloat16, ...).
TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

# Strategy ids that generate a GEMM variant -> schedule module (kernel_lib.SCHEDULES names).
GEMM_STRATEGIES = ("dp", "split_k", "persistent", "stream_k", "warp_specialization", "cluster_gemm")
GROUPED = "grouped"  # many independent GEMMs in one launch (kernels/grouped_gemm.py)
COMM_OVERLAP = "comm_overlap"  # a tensor-parallel GEMM overlapped with its collective (kernels/comm_overlap.py)
SPLIT_KV = "split_kv"  # decode attention split over the KV sequence (kernels/split_kv_attention.py)
COMM_PATTERNS = ("all_gather_matmul", "matmul_reduce_scatter")

# The SM count `advisor generate` and the model assume unless told: the H200's (and H100 SXM's).
DEFAULT_SM_COUNT = 132

# A winner must beat the best baseline (and the observed kernel) by more than this: timing
# spread between repeated medians on the H200 was a few percent.
NOISE_MARGIN = 0.03


# Element-type names as PyTorch (Kineto's "Input type"), NVTX ranges and people write them ->
# our dtype ids.
DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16", "c10::bfloat16": "bf16",
    "fp16": "fp16", "half": "fp16", "float16": "fp16", "c10::half": "fp16",
    "fp32": "fp32", "float": "fp32", "float32": "fp32",
    "fp8": "fp8", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8",
    # the fp8 formats of AMD MI300 (CDNA3): no negative zero, NaN at 0x80
    "c10::float8_e4m3fnuz": "fp8", "c10::float8_e5m2fnuz": "fp8",
    # known so that nothing assumes bf16 for it (the schedules do not generate fp64)
    "fp64": "fp64", "double": "fp64", "float64": "fp64",
}


def op_base(name: str) -> str:
    """'aten::addmm_.out' -> 'addmm': an operator's name without namespace, overload and the
    in-place mark."""
    return name.split("::")[-1].split(".")[0].strip().rstrip("_")


def json_list(text: Any) -> list | None:
    """A Kineto argument column held as JSON text ("Input Dims", "Input Strides", "Concrete
    Inputs") -> its list, else None."""
    if not isinstance(text, str):
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, list) else None


def input_dims(input_dims: Any) -> list | None:
    """Kineto's "Input Dims" JSON text -> the list of each input's dims, else None."""
    return json_list(input_dims)


def input_dtypes(input_types: Any) -> list[str | None]:
    """Kineto's "Input type" JSON text -> each input's dtype id (None where unknown or not a
    tensor); [] when there is none or it does not parse."""
    if not isinstance(input_types, str):
        return []
    try:
        types = json.loads(input_types)
    except ValueError:
        return []
    return [DTYPE_ALIASES.get(str(t).lower()) for t in types] if isinstance(types, list) else []


class ShapeError(AdvisorError, ValueError):
    """A shape that is not MxNxK: an AdvisorError for the CLI (one line, exit 2), a ValueError
    for the bench scripts that catch that."""


def parse_shape(text: str) -> tuple[int, int, int]:
    """'4096x4096x8192' -> (4096, 4096, 8192), each 1..2**31-1 ('x', 'X', '*' or ',' between)."""
    m = re.fullmatch(r"\s*(\d{1,10})\s*[xX*,]\s*(\d{1,10})\s*[xX*,]\s*(\d{1,10})\s*", str(text))
    if not m:
        raise ShapeError(f"shape {text!r}: expected MxNxK, e.g. 4096x4096x8192")
    dims = tuple(int(g) for g in m.groups())
    if not all(1 <= d < 2**31 for d in dims):
        raise ShapeError(f"shape {text!r}: each of M, N, K must be between 1 and 2^31-1")
    return dims  # type: ignore[return-value]


def group_sizes(count: int = 64, lo: int = 128, hi: int = 512, seed: int = 0, multiple: int = 8) -> list[tuple]:
    """`count` (M, N, K) triples, each dimension uniform in lo..hi on multiples of
    `multiple` (8 keeps every row 16-byte aligned in 16-bit types, which TMA and
    torch._grouped_mm need). Seeded: the same group every run."""
    rng = random.Random(seed)
    choices = list(range(-(-lo // multiple) * multiple, hi + 1, multiple))
    return [(rng.choice(choices), rng.choice(choices), rng.choice(choices)) for _ in range(count)]


def torch_dtype(name: str):
    """torch.bfloat16 for 'bf16' (one of DTYPES); imports torch, so call it only where torch runs."""
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[name])


# Kineto's `Input type` strings of tensors and their element sizes (the profiler's C++ type names)
KINETO_TYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "unsigned int": 4, "unsigned short": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
}
