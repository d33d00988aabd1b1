"""What kind of work a kernel does, and which kernels are "the same" across two traces.

`kernel_class` puts each kernel in one of CLASSES (the breakdown `advisor compare` reports);
`family` reduces a kernel name to what stays put when a trace is recorded by another
profiler or the library picks another configuration: Kineto writes
`void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, ...>(...)` where
nsys writes `void at::native::<unnamed>::cunn_SoftMaxForward<(int)4, float, ...>(...)`, and
cuBLAS names its tile in the kernel (`nvjet_sm90_tst_256x128_...` vs `..._320x128_...`).
GEMM and communication names come from advisor.symptoms.gemm's classifiers, so a kernel is a
GEMM here exactly when the diagnosis treats it as one.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .gemm import _COMM, _GEMM, _NOT_GEMM
from .strings import factorize

CLASSES = ("gemm", "attention", "communication", "copy", "reduction", "elementwise", "other")

_ATTENTION = re.compile(
    r"sdpa|fmha|flash_?attn|flash_(?:fwd|bwd|fprop|bprop)|flash::|attention|paged_attn|_attn_", re.I
)
# The reduction of a split-K GEMM is part of that GEMM's work.
_GEMM_HELPER = re.compile(r"splitkreduce|split_k_reduce|_fixup|gemv|gemvx", re.I)
_COPY = re.compile(r"copy|memcpy|memset|catarray|transpose|relayout", re.I)
_REDUCTION = re.compile(
    r"reduce|softmax|norm|welford|cross_?entropy|nll_loss|argmax|argmin|topk|sort|scan|cumsum|"
    r"^triton_(?:red|per)_|sum_kernel|mean_kernel",
    re.I,
)
_ELEMENTWISE = re.compile(
    r"elementwise|^triton_poi_|pointwise|vectorized|unrolled|fill|gelu|silu|relu|sigmoid|tanh|dropout|"
    r"multi_tensor_apply|foreach|adam|sgd|index|embedding|rotary|rope",
    re.I,
)


def classify_name(name: str, is_gemm: bool = False, is_comm: bool | None = None) -> str:
    """The class of one kernel: `is_gemm` from the diagnosis (a kernel inside a GEMM
    operator's range is one whatever its name); `is_comm` computed from the name if None."""
    text = name if isinstance(name, str) else ""
    if is_comm if is_comm is not None else bool(_COMM.search(text)):
        return "communication"
    if _ATTENTION.search(text):
        return "attention"
    if is_gemm or _GEMM_HELPER.search(text) or (_GEMM.search(text) and not _NOT_GEMM.search(text)):
        return "gemm"
    if _COPY.search(text):
        return "copy"
    if _REDUCTION.search(text):
        return "reduction"
    if _ELEMENTWISE.search(text):
        return "elementwise"
    return "other"


def classify(names: pd.Series, is_gemm: pd.Series, is_comm: pd.Series) -> pd.Series:
    """classify_name for a column of kernels (Context.kernels' is_gemm / is_comm), computed
    once per distinct (name, is_gemm, is_comm)."""
    codes, uniq = factorize(names)
    key = pd.DataFrame({"c": codes, "g": np.asarray(is_gemm, dtype=bool), "m": np.asarray(is_comm, dtype=bool)})
    groups = key.groupby(["c", "g", "m"], sort=False).ngroup().to_numpy()
    first = key.drop_duplicates()
    labels = np.array([classify_name(uniq[c] if c >= 0 else "", g, m) for c, g, m in first.itertuples(index=False)],
                      dtype=object)
    return pd.Series(labels[groups] if len(groups) else np.empty(0, dtype=object), index=names.index, dtype=object)


_ANON = re.compile(r"\(anonymous namespace\)|<unnamed>|\{anonymous\}")
_VOID_CONST = re.compile(r"\b(?:void|const|volatile)\b")
_INT_SUFFIX = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b", re.I)
_PARENS = re.compile(r"\([^()]*\)")
_LAMBDA = re.compile(r"\[lambda\]|\{lambda#?\d*\}")
_BOOL = re.compile(r"\b(?:true|false)\b")
_DIGITS = re.compile(r"\d+")


def family(name: str) -> str:
    """A kernel name's family: what two demanglers and two library configurations agree on.
    Return types, `const`, casts and parameter lists (every parenthesised group) go, the
    anonymous namespace and lambdas get one spelling each, whitespace goes, and numbers and
    booleans become `#` (nsys writes `<(int)4, false>` where Kineto writes `<4, 0>`)."""
    if not isinstance(name, str):
        return "?"
    text = _ANON.sub("anon", name)
    text = _VOID_CONST.sub(" ", text)
    text = _INT_SUFFIX.sub(r"\1", text)
    while True:  # innermost groups first: casts, parameter lists, `(instance 1)`
        stripped = _PARENS.sub("", text)
        if stripped == text:
            break
        text = stripped
    text = re.sub(r"\s+", "", text)
    text = _LAMBDA.sub("lambda", text)
    text = _BOOL.sub("#", text)
    return _DIGITS.sub("#", text) or "?"


def families(names: pd.Series) -> pd.Series:
    """family() of a column, computed once per distinct name."""
    codes, uniq = factorize(names)
    fams = np.array([family(u) for u in uniq] + ["?"], dtype=object)
    return pd.Series(fams[np.where(codes >= 0, codes, len(uniq))], index=names.index, dtype=object)
