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

from ..basics import KINETO_TYPE_BYTES

# Kineto's `Input type` strings of tensors, and their element sizes (advisor.basics)
ELEMENT_BYTES = KINETO_TYPE_BYTES

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
    r"|_nested|sparse|^to$|^_to_copy$|quantile|pool[123]d(_with_indices)?$",
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


# `Input type` strings of arguments that are not tensors
_NOT_TENSORS = {"", "Scalar", "ScalarList", "None", "Device", "Layout", "ScalarType", "MemoryFormat", "Generator",
                "Storage", "Stream", "String", "int[]", "float[]", "bool[]"}
_INTEGER = {"long int", "int", "short int", "signed char", "unsigned char", "bool", "unsigned int", "unsigned short"}
# reductions that also return (or only return) int64 indices
_INDEX_RESULT = {"max", "min", "argmax", "argmin"}
# where a reduction's dim argument is (norm's second argument is p)
_DIM_AT = {"norm": 2, "linalg_vector_norm": 2}
# ops that write floats from integer inputs (true division, transcendental functions)
_FLOAT_RESULT = {"div", "true_divide", "sqrt", "rsqrt", "exp", "log", "log2", "log10", "sigmoid", "tanh", "sin", "cos",
                 "mean", "reciprocal", "erf"}
_FLOAT_TEXT = re.compile(r"^[-+]?(\d*\.\d*(e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)$", re.I)


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
    concrete = _load(concrete_text)
    concrete = concrete if isinstance(concrete, list) and len(concrete) == len(dims) else None
    tensors = []  # (dims, elt, stored elements) of each tensor argument, in order
    shaped_types = []  # the type of each of them with dimensions (not 0-dim), in order
    float_scalar = False  # a floating 0-dim tensor or Python number among the arguments
    for i, (d, t, st) in enumerate(zip(dims, types, strides)):
        if not isinstance(t, str):
            t = "?"  # (not what Kineto writes: a tensor of it is unknown, below)
        if t in ("TensorList", "GenericList"):
            return None
        elt = ELEMENT_BYTES.get(t)
        d = _ints(d)
        if elt is None:
            if d and t not in _NOT_TENSORS:
                return None  # a tensor of a dtype we cannot size: its bytes would be left out
            if t == "Scalar" and concrete and isinstance(concrete[i], str) and _FLOAT_TEXT.match(concrete[i].strip()):
                float_scalar = True  # 0.5, 1e-05, inf, nan (not True, None or 2)
            continue
        if d is None:
            continue
        if not d and t not in _INTEGER:
            float_scalar = True
        if d:
            shaped_types.append(t)
        tensors.append((d, elt, _elements(d, _ints(st))))
    if not tensors:
        return None
    read = sum(n * elt for _, elt, n in tensors)
    # the output's element size: type promotion among the dimensioned arguments (the widest;
    # an integer tensor with a floating scalar makes a float)
    base = _base(name)
    out_elt = _out_elt(base, tensors, shaped_types, float_scalar, concrete)
    fam = family(name)
    if fam == "reduction" and sum(1 for d, _, _ in tensors if d) > 1:
        fam = "other"  # max(a, b), min(a, b): elementwise
    if fam == "scatter" or base in _WRITE_ONLY:
        return read
    if base.endswith("_"):  # in place: self read (counted) and written
        d, elt, n = tensors[0]
        return read + n * elt
    largest = max(math.prod(d) for d, _, _ in tensors)
    if fam == "reduction":
        out = _reduced_elements(tensors[0][0], concrete, types, _DIM_AT.get(base, 1))
        if base.startswith("arg"):
            out_elt = 8
        elif base in _INDEX_RESULT and out is not None and out != 1:
            out_elt += 8  # max/min over a dim: values and int64 indices
        if base == "aminmax":
            out_elt *= 2  # its min and its max
        return read + (largest if out is None else out) * out_elt
    if fam == "gather":
        return _gather_bytes(base, tensors, concrete)
    if fam == "upsample":
        out = _upsample_out(name, tensors[0], concrete)
        return None if out is None else read + out
    # out of place: writes the broadcast of its arguments (at least its largest) in the promoted dtype
    elements = _broadcast_elements([d for d, _, _ in tensors])
    out = elements * out_elt
    if base == "native_dropout":
        out += elements  # and its bool mask
    return read + out


# operators whose output has their first argument's dtype (their other tensors are parameters
# or statistics: a norm's fp32 weight does not make a bf16 activation fp32)
_KEEPS_INPUT_DTYPE = re.compile(r"norm|softmax|dropout|pool|upsample|pad|roll|flip|transpose|permute|clone|contiguous", re.I)


def _out_elt(base: str, tensors, dtypes: list[str], float_scalar: bool, concrete=None) -> int:
    """The output's element size (`dtypes`: the types of the dimensioned ones among `tensors`,
    in order). Elementwise ops promote: the widest floating dimensioned argument (bf16 + fp32 ->
    fp32); integer tensors only where there is no floating one, and an integer tensor with a
    floating number makes fp32 (uint8 / 255.0). Index tensors (int64) beside floating ones do
    not set it."""
    if base in ("_softmax", "_log_softmax") and concrete and len(concrete) > 2 and concrete[2] == "True":
        return 4  # half_to_float: softmax(x_fp16, dtype=torch.float32)
    if _KEEPS_INPUT_DTYPE.search(base):
        return tensors[0][1]
    shaped = list(zip([elt for d, elt, _ in tensors if d], dtypes))
    floats = [elt for elt, t in shaped if t not in _INTEGER]
    if floats:
        return max(floats)
    ints = [elt for elt, _ in shaped] or [tensors[0][1]]
    rounding = concrete and any(isinstance(c, str) and c.strip("'\"") in ("trunc", "floor") for c in concrete)
    if float_scalar or (base in _FLOAT_RESULT and not rounding):
        return max(max(ints), 4)
    return max(ints)


def _reduced_elements(d: list[int], concrete, types, at: int = 1) -> int | None:
    """Elements a reduction of a tensor of dims `d` writes, from its dim argument (at `at`) in
    Concrete Inputs ("[1]", "-1"; "[]", "" or "None" for a non-tensor argument: every dim);
    None where the trace does not say."""
    if not concrete or len(concrete) <= at or not d:
        return None if concrete is None or not d else 1  # (sum(x): no dim argument at all)
    v = concrete[at]
    if not isinstance(v, str):
        return None
    if v.strip() in ("", "None"):
        return 1 if (types[at] if at < len(types) else "") not in ELEMENT_BYTES else None
    try:
        parsed = json.loads(v)
    except ValueError:
        return None
    if isinstance(parsed, int) and not isinstance(parsed, bool):
        parsed = [parsed]
    parsed = _ints(parsed)
    if parsed is None:
        return None
    if not parsed:  # all dims
        return 1
    axes = {a % len(d) for a in parsed if -len(d) <= a < len(d)}
    return math.prod(x for i, x in enumerate(d) if i not in axes)


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
        dim = concrete[1] if isinstance(concrete, list) and len(concrete) > 1 else None
        if not (isinstance(dim, str) and dim.lstrip("-").isdigit()):
            return None  # (PyTorch before 2.1 records no Concrete Inputs: the dim is unknown)
        dim = int(dim)
        rows = max(s[dim], 1) if s and -len(s) <= dim < len(s) else 1
        out = math.prod(s) // rows * math.prod(i) * selt
        return inn * ielt + min(out, sn * selt) + out
    # gather / take / take_along_dim (self, index): output has the index's shape
    (s, selt, sn), (i, ielt, inn) = tensors[0], tensors[1]
    out = math.prod(i) * selt
    return inn * ielt + min(out, sn * selt) + out


def _upsample_out(name: str, first, concrete) -> int | None:
    """Bytes an upsampling call writes: batch x channels x the output size in `Concrete Inputs`;
    its backward writes the input's gradient, whose full size (input_size) it also records."""
    d, elt, _ = first
    if not isinstance(concrete, list) or len(d) < 3:
        return None
    backward = "backward" in name
    want = len(d) if backward else len(d) - 2
    for v in concrete[1:]:
        size = _ints(_load(v)) if isinstance(v, str) and v.startswith("[") else None
        if size and len(size) == want and all(x > 0 for x in size):
            return math.prod(size) * elt if backward else d[0] * d[1] * math.prod(size) * elt
    return None


__all__ = ["ELEMENT_BYTES", "op_bytes", "family", "skipped"]
