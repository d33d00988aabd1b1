"""The bytes a framework operator must move, from what the profiler recorded of its arguments.

`op_bytes(name, dims, types, strides, concrete)` takes one Kineto cpu_op's `Input Dims`,
`Input type`, `Input Strides` and `Concrete Inputs` (JSON text, as advisor keeps them) and
returns the operator's compulsory HBM traffic: every tensor argument read once and its output
written once, or None where the operator's traffic cannot be read off its arguments (compute-
bound families, tensor lists, an output whose size the trace does not give).

The count is built to err high (a kernel then looks faster than it is, and no finding is
made on a kernel that is not slow):
- a tensor argument counts its storage extent, not its logical size: a broadcast view
  (stride 0, `edge_index.expand(-1, 256)`) is read once per stored element, never more than
  its logical size;
- an out-of-place operator writes as many elements as its largest argument (a broadcast's
  output is at least that); a reduction writes nothing worth counting;
- an in-place operator writes `self` again, except those that only write it (copy_, fill_,
  zero_, random fills) and the scatter family (it writes the rows it touches, counted once);
- gather-like operators (embedding, index_select, gather) read as many rows as they write;
- upsampling writes its output size (`Concrete Inputs`), and is skipped without it.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache

# Kineto's `Input type` strings of tensors, and their element sizes
ELEMENT_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "unsigned int": 4, "unsigned short": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
}

# Families whose time is not set by their bytes (matrix products, convolutions, attention,
# recurrent layers, sorting and the ops built on it, scans, FFTs, linear algebra, random
# permutations, losses with their own reductions), or whose traffic the arguments do not say
# (tensor lists: cat, stack, foreach; advanced indexing with a list of index tensors).
_SKIP = re.compile(
    r"mm|matmul|linear|conv|attention|_flash|_efficient|lstm|gru|rnn|sort|topk|kthvalue|unique|nonzero|median"
    r"|^mode$|cumsum|cumprod|cummax|cummin|logcumsumexp|fft|stft|bincount|histc|histogram|searchsorted|bucketize"
    r"|multinomial|randperm|nms|roi_|linalg|cholesky|^lu|^qr$|geqrf|orgqr|svd|^eig|symeig|^det$|logdet|inverse"
    r"|solve|cdist|pdist|einsum|tensordot|embedding_dense_backward|embedding_bag|index_put|loss|ctc|cat$|stack"
    r"|_foreach|grid_sampler|im2col|col2im|unfold|^fold|pad|repeat|^tile$|expand|as_strided|view|reshape|item$"
    r"|_local_scalar|_assert|empty|^zeros|^ones|^full|arange|linspace|scalar_tensor|^tensor$|to_dense|to_sparse"
    r"|_nested|sparse|^to$|^_to_copy$|quantile",
    re.I)

# In-place operators that only write `self`: its bytes count once
_WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
               "geometric_", "log_normal_", "cauchy_", "index_fill_", "set_"}
# Scatter into `self` at indexed rows: self counts once (the rows written), the source and index once
_SCATTER = {"index_add", "index_add_", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
            "scatter_reduce_", "index_reduce", "index_reduce_", "index_copy", "index_copy_", "masked_scatter",
            "masked_scatter_", "put_", "put"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "linalg_vector_norm", "var",
               "std", "var_mean", "std_mean", "prod", "all", "any", "logsumexp", "nansum", "count_nonzero", "aminmax"}


def family(name: str) -> str:
    """'scatter' | 'upsample' | 'gather' | 'reduction' | 'other' (everything else counted)."""
    base = _base(name)
    if base in _SCATTER:
        return "scatter"
    if "upsample" in base:
        return "upsample"
    if base in ("embedding", "index_select", "gather", "take", "take_along_dim"):
        return "gather"
    if base in _REDUCTIONS:
        return "reduction"
    return "other"


def _base(name: str) -> str:
    return name.split("::", 1)[-1].split(".", 1)[0]


def skipped(name: str) -> bool:
    """True where this operator's time is not set by the bytes of its arguments (or they are not known)."""
    base = _base(name)
    return "upsample" not in base and bool(_SKIP.search(base))  # (upsample_bilinear2d: not a linear layer)


def _load(text):
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    try:
        return json.loads(text) if isinstance(text, str) else text
    except (TypeError, ValueError):
        return None


def _ints(v) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def _elements(dims: list[int], strides: list[int] | None) -> int:
    """Elements a tensor of `dims` stores (its extent in memory, at most its logical size)."""
    if any(d == 0 for d in dims):
        return 0
    numel = math.prod(dims)
    if strides is None or len(strides) != len(dims):
        return numel
    extent = 1 + sum((d - 1) * abs(s) for d, s in zip(dims, strides))
    return min(numel, extent)


@lru_cache(maxsize=65536)
def op_bytes(name: str, dims_text: str | None, types_text: str | None, strides_text: str | None = None,
             concrete_text: str | None = None) -> int | None:
    """Compulsory bytes of one call of `name` (module docstring), or None where not known."""
    if skipped(name):
        return None
    dims, types = _load(dims_text), _load(types_text)
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    strides = _load(strides_text)
    strides = strides if isinstance(strides, list) and len(strides) == len(dims) else [None] * len(dims)
    tensors = []  # (dims, elt, stored elements) of each tensor argument, in order
    for d, t, s in zip(dims, types, strides):
        if t == "TensorList" or t == "GenericList":
            return None
        elt = ELEMENT_BYTES.get(t)
        d = _ints(d)
        if elt is None or d is None:
            continue
        tensors.append((d, elt, _elements(d, _ints(s))))
    if not tensors:
        return None
    read = sum(n * elt for _, elt, n in tensors)
    base = _base(name)
    fam = family(name)
    if fam == "scatter" or base in _WRITE_ONLY:
        return read
    if base.endswith("_"):  # in place: self read (counted) and written
        d, elt, n = tensors[0]
        return read + n * elt
    if fam == "reduction":
        return read
    if fam == "gather":
        return _gather_bytes(base, tensors, _load(concrete_text))
    if fam == "upsample":
        out = _upsample_out(tensors[0], _load(concrete_text))
        return None if out is None else read + out
    # out of place: writes the broadcast of its arguments (at least its largest), in that one's dtype
    _, elt, _ = max(tensors, key=lambda x: (math.prod(x[0]), x[1]))
    return read + _broadcast_elements([d for d, _, _ in tensors]) * elt


def _broadcast_elements(shapes: list[list[int]]) -> int:
    """Elements of the broadcast of `shapes` (the largest one's where they do not broadcast)."""
    rank = max(len(x) for x in shapes)
    out = []
    for i in range(1, rank + 1):
        sizes = {x[-i] for x in shapes if len(x) >= i} - {1}
        if len(sizes) > 1:
            return max(math.prod(x) for x in shapes)
        out.append(sizes.pop() if sizes else 1)
    return math.prod(out)


def _gather_bytes(base: str, tensors, concrete) -> int | None:
    """Rows read as many as written: the index, plus the output twice (never more of the source than it holds)."""
    if len(tensors) < 2:
        return None
    if base == "embedding":  # (weight [V, D], indices)
        (w, welt, wn), (i, ielt, inn) = tensors[0], tensors[1]
        out = math.prod(i) * (w[-1] if w else 1) * welt
        return inn * ielt + min(out, wn * welt) + out
    if base == "index_select":  # (self, dim, index): the output is self's slices along dim, picked
        (s, selt, sn), (i, ielt, inn) = tensors[0], tensors[1]
        dim = concrete[1] if isinstance(concrete, list) and len(concrete) > 1 else "0"
        dim = int(dim) if isinstance(dim, str) and dim.lstrip("-").isdigit() else 0
        rows = max(s[dim], 1) if s and -len(s) <= dim < len(s) else 1
        out = math.prod(s) // rows * math.prod(i) * selt
        return inn * ielt + min(out, sn * selt) + out
    # gather / take / take_along_dim (self, index): output has the index's shape
    (s, selt, sn), (i, ielt, inn) = tensors[0], tensors[1]
    out = math.prod(i) * selt
    return inn * ielt + min(out, sn * selt) + out


def _upsample_out(first, concrete) -> int | None:
    """Output bytes of an upsampling call: batch x channels x the output size in `Concrete Inputs`."""
    d, elt, _ = first
    if not isinstance(concrete, list) or len(d) < 3:
        return None
    spatial = len(d) - 2
    for v in concrete[1:]:
        size = _load(v) if isinstance(v, str) and v.startswith("[") else None
        size = _ints(size)
        if size and len(size) == spatial and all(x > 0 for x in size):
            return d[0] * d[1] * math.prod(size) * elt
    return None


__all__ = ["ELEMENT_BYTES", "op_bytes", "family", "skipped"]
