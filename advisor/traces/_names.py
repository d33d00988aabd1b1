"""Kernel-name clean-ups shared by the readers that get names without nsys's `shortName`."""

from __future__ import annotations

from typing import Iterable

import pandas as pd

# AMD code-object suffixes: "foo.kd", rocprofv2 "foo(int) (.kd)", rocprofv3 demangled
# "foo(int) [clone .kd]".
_KD_SUFFIXES = (" [clone .kd]", "[clone .kd]", " (.kd)", "(.kd)", ".kd")
_ANON = "(anonymous namespace)"


def strip_kd(name: str) -> str:
    """`name` without an AMD kernel-descriptor suffix (`.kd`, ` (.kd)`, ` [clone .kd]`)."""
    s = name.rstrip()
    for suffix in _KD_SUFFIXES:
        if s.endswith(suffix):
            return s[: -len(suffix)].rstrip()
    return s


def short_name(name: str) -> str:
    """The bare function name: no return type, namespaces, template or argument lists.

    `void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)` gives
    `vectorized_elementwise_kernel`; names without such decoration (Triton's
    `triton_poi_fused_add_0`, `Cijk_...`, `nvjet_...`) come back unchanged. This is a cheap
    textual cut, not a demangler: it looks only at the first `<` or `(` outside
    `(anonymous namespace)`.
    """
    s = strip_kd(name.strip())
    if s.startswith("void "):
        s = s[5:]
    s = s.replace(_ANON, "")
    cut = len(s)
    for ch in "<(":
        i = s.find(ch)
        if 0 < i < cut:
            cut = i
    s = s[:cut].rstrip()
    if "::" in s:
        s = s.rsplit("::", 1)[1]
    s = s.strip()
    return s or name


def short_names(names: Iterable[object]) -> list[object]:
    """`short_name` of each name (computed once per distinct name); missing names stay None."""
    names = list(names)
    cache: dict[str, str] = {}
    out: list[object] = []
    for n in names:
        if n is None or (not isinstance(n, str) and pd.isna(n)):
            out.append(None)
            continue
        n = str(n)
        s = cache.get(n)
        if s is None:
            s = cache[n] = short_name(n)
        out.append(s)
    return out
