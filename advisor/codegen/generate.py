"""Generate a standalone variant file for a strategy and shape (finding -> code).

    from advisor.codegen.generate import generate
    v = generate("split_k", 256, 256, 131072, dtype="bf16", path="variant.py")
    v.path, v.knobs, v.chosen_by

Knobs come, in order of precedence, from the caller (`knobs=`), from measurement (the bench
runner passes the winner), or from the analytical model ranking the schedule's autotune
search space (needs torch and triton to import the schedule; without them the schedule's
defaults plus the model's split/policy choice are used, and CHOSEN_BY says so).

`generate_grouped(sizes, ...)` writes the grouped-GEMM variant (many independent GEMMs in
one persistent launch, kernels/grouped_gemm.py) for a list of (M, N, K); `parse_group`
reads the bench's COUNT:LO:HI[:SEED] and `group_sizes` draws the group from it.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from .bundle import bundle, coerce_knobs, config_fields
from ..basics import COMM_OVERLAP, COMM_PATTERNS, DTYPES, GEMM_STRATEGIES, GROUPED, SPLIT_KV, parse_shape, torch_dtype
from ..errors import AdvisorError
from ..report.render import PySafe, code_environment
from .schedule_model import Device, rank, stream_k_policies, suggest_split_k

MAX_GROUP = 65536  # GEMMs in one generated group (every size is written into the file)
_GROUP_MULTIPLE = 8  # advisor.basics.group_sizes' default: rows stay 16-byte aligned in 16-bit types
_IDENT = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
# The kernel-library names templates/variant.py.j2's own code calls: a GEMM variant carries
# these and what they call (codegen.bundle), not the whole library
VARIANT_ROOTS = ("Config", "matmul", "TOLERANCE", "fix_interpreter_bf16_dot", "torch", "tma_layout", "on_pointer_loads")


@dataclass
class Variant:
    strategy: str
    M: int
    N: int
    K: int
    dtype: str
    knobs: dict[str, Any]
    chosen_by: dict[str, Any]
    source: str
    path: Path | None = None
    model: list[dict] = field(default_factory=list)
    # grouped: every member's (M, N, K); M, N and K above are then the group's largest
    sizes: list[tuple[int, int, int]] = field(default_factory=list)
    # what the file will refuse at run time that only then can be known (comm_overlap: the world size)
    warnings: list[str] = field(default_factory=list)
    # split_kv: the attention problem {"B", "Hq", "Hkv", "D", "S", "Lq"} (M, N, K above are then
    # B x Hq x Lq query rows, D and S)
    attn: dict[str, int] = field(default_factory=dict)

    @property
    def kernel_lines(self) -> int:
        """Lines of the schedule's own kernel file (the complexity a reader takes on)."""
        from .kernel_lib import source_path

        return len(source_path(self.strategy).read_text(encoding="utf-8").splitlines())


def _ident(value: Any, what: str) -> PySafe:
    text = str(value)
    if not _IDENT.match(text):
        raise AdvisorError(f"{what} {text!r} is not a plain identifier")
    return PySafe(text)


def _check_problem(M: int, N: int, K: int, dtype: str) -> None:
    if dtype not in DTYPES:
        raise AdvisorError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31:
            raise AdvisorError(f"{name}={v!r}: must be an integer in 1..2^31-1")


def _finish(variant: Variant, filename: str, target: Path | None) -> Variant:
    """Compile the rendered text (a template bug must fail here, not on the user's GPU) and
    write it when a path was given."""
    compile(variant.source, filename, "exec")
    if target is not None:
        from ..safeio import write_file

        target.parent.mkdir(parents=True, exist_ok=True)
        write_file(target, variant.source)  # never through a symlink planted at -o
        variant.path = target
    return variant


_UNTUNED = {"gpu": None, "sm_count": None, "compute_capability": None, "smem_per_block_bytes": None}


def _render(template: str, path: str | Path | None, *, dtype: str, knobs: dict, finding: dict | None, source: str,
            strategy: str | None = None, tuned_for: dict | None = None, chosen_by: dict | None = None,
            **context: Any) -> tuple[str, str, Path | None]:
    """(text, file name, target path or None) of `template` rendered with `context` plus what
    every variant template shares: the dtype, knobs, finding and kernel source; for a strategy,
    its id, the GPU it was tuned for and how the knobs were chosen; the advisor version,
    today's date, and the file and module names the variant's docstring tells the user to run
    and import."""
    if strategy is not None:
        context.update(strategy=strategy, strategy_id=_ident(strategy, "strategy"), tuned_for=tuned_for or dict(_UNTUNED),
                       chosen_by=chosen_by)
    context.update(dtype=dtype, dtype_id=_ident(dtype, "dtype"), knobs=knobs, finding=finding or {},
                   kernel_source=PySafe(source))
    target = Path(path) if path is not None else None
    filename = target.name if target is not None else "variant.py"
    module = target.stem if target is not None else "variant"
    if not module.isidentifier():
        module = "variant"
    text = code_environment().get_template(template).render(
        **context,
        advisor_version=_ident(__version__, "version"),
        date_id=_ident(_dt.date.today().isoformat(), "date"),
        filename_id=_ident(filename if _IDENT.match(filename) else "variant.py", "file name"),
        module_id=_ident(module, "module"),
    )
    return text, filename, target


def _defaults(strategy: str) -> dict[str, Any]:
    return {f.name: f.default for f in config_fields(strategy)}


def _check_config(strategy: str, knobs: dict[str, Any], dtype: str) -> None:
    """Refuse a knob set the schedule would refuse, with the schedule's own checks, before a
    file is written: building its Config (the __post_init__ rules), then what its matmul
    checks before launching an explicit config (Config.validate(dtype) in ws and grouped, the
    shared-memory check in the others). Skipped where the schedule cannot be imported (no
    torch/triton here); the variant then runs the same checks when it is imported."""
    try:
        import torch  # noqa: F401  (the probe: no torch, ImportError)

        from .kernel_lib import load

        mod = load(strategy)
    except ImportError:
        return
    tdtype = torch_dtype(dtype)
    # persistent has its own (per-program, x PROGRAMS_PER_SM) shared-memory check
    smem_check = getattr(mod, "_check_smem", None) or getattr(mod, "check_smem", None)
    try:
        cfg = mod.Config(**knobs)
        if hasattr(cfg, "validate"):
            cfg.validate(tdtype)
        elif smem_check is not None and hasattr(cfg, "smem_bytes"):
            smem_check(cfg, tdtype)
    except (TypeError, ValueError) as exc:
        raise AdvisorError(f"{strategy} knobs: {exc}") from None


def _model_candidates(strategy: str, M: int, N: int, K: int, dtype: str, dev: Device) -> tuple[list[dict], str]:
    """Candidate knob dicts for the model to rank: the schedule's own search space when it can
    be imported, else its defaults with the model's split factor / Stream-K policies."""
    try:
        import torch  # noqa: F401  (the probe: no torch, ImportError)

        from .kernel_lib import load

        mod = load(strategy)
        tdtype = torch_dtype(dtype)
        space = mod.search_space(M, N, K, tdtype, dev.sm_count)
        from dataclasses import asdict

        return [asdict(c) for c in space], "the schedule's autotune search space"
    except ImportError:
        pass
    base = _defaults(strategy)
    cands = [base]
    bm, bn, bk = (base.get(k) or base.get(k.lower()) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    if strategy == "split_k" and "SPLIT_K" in base:
        s = suggest_split_k(M, N, K, bm, bn, bk, dev.sm_count)
        cands = [dict(base, SPLIT_K=s)]
    if strategy == "stream_k" and "policy" in base:
        tiles = -(-M // bm) * -(-N // bn)
        cands = [dict(base, policy=p) for p in stream_k_policies(tiles, dev.sm_count)]
    return cands, "the schedule's defaults (torch/triton not importable here)"


def choose_knobs(strategy: str, M: int, N: int, K: int, dtype: str, dev: Device) -> tuple[dict[str, Any], dict[str, Any], list[dict]]:
    cands, source = _model_candidates(strategy, M, N, K, dtype, dev)
    ranked = rank(strategy, cands, M, N, K, DTYPES[dtype], dev)
    best = ranked[0]
    chosen = {
        "how": "analytical model",
        "candidates_from": source,
        "predicted_us": round(best.predicted_us, 2),
        "model_notes": best.notes,
        "device_model": {"gpu": dev.name, "sm_count": dev.sm_count},
    }
    return dict(best.config), chosen, [p.row() for p in ranked]


def generate(
    strategy: str,
    M: int,
    N: int,
    K: int,
    dtype: str = "bf16",
    knobs: dict[str, Any] | None = None,
    *,
    finding: dict[str, Any] | None = None,
    device: Device | None = None,
    tuned_for: dict[str, Any] | None = None,
    chosen_by: dict[str, Any] | None = None,
    path: str | Path | None = None,
) -> Variant:
    """Render the variant file for `strategy` on an MxNxK `dtype` GEMM; write it to `path`
    when given. `knobs` override the model's choice knob by knob."""
    if strategy == GROUPED:
        raise AdvisorError("strategy 'grouped' takes a group of shapes: use generate_grouped(sizes, ...)")
    if strategy not in GEMM_STRATEGIES:
        raise AdvisorError(f"strategy {strategy!r}: generate supports {', '.join(GEMM_STRATEGIES)}")
    _check_problem(M, N, K, dtype)
    dev = device or Device()
    model_rows: list[dict] = []
    if chosen_by is None:
        base, chosen_by, model_rows = choose_knobs(strategy, M, N, K, dtype, dev)
    else:
        base = _defaults(strategy)
    final = dict(base)
    if knobs:
        final.update(coerce_knobs(strategy, knobs))
        chosen_by = dict(chosen_by, overridden=sorted(knobs))
    final = coerce_knobs(strategy, final)
    _check_config(strategy, final, dtype)
    extra = ("dp",) if strategy != "dp" else ()
    # only what the template's code below the kernels calls, and what that calls in turn
    source, renamed = bundle(strategy, extra=extra, roots=VARIANT_ROOTS, extra_roots=("matmul",))
    if strategy == "dp":
        baseline = "lambda a, b: matmul(a, b)  # the data-parallel schedule's default config"
    else:
        dp_matmul = renamed.get("dp_gemm", {}).get("matmul", "matmul")
        baseline = f"lambda a, b: {dp_matmul}(a, b)  # advisor's data-parallel baseline, default config"
    text, filename, target = _render(
        "variant.py.j2", path, strategy=strategy, dtype=dtype, knobs=final, finding=finding, source=source,
        tuned_for=tuned_for, chosen_by=chosen_by,
        M=M,
        N=N,
        K=K,
        baseline_expr=PySafe(baseline),
    )
    return _finish(Variant(strategy, M, N, K, dtype, final, chosen_by, text, None, model_rows), filename, target)


def parse_group(text: str) -> dict[str, int]:
    """'64:128:512' or '64:128:512:0' -> {"count", "lo", "hi", "seed"}: COUNT GEMMs whose M,
    N and K are drawn in LO..HI (seed 0 unless given), bench/bench_gemm.py's --grouped."""
    m = re.fullmatch(r"\s*(\d{1,10}):(\d{1,10}):(\d{1,10})(?::(-?\d{1,19}))?\s*", str(text))
    if not m:
        raise AdvisorError(f"group {text!r}: expected COUNT:LO:HI[:SEED] integers, e.g. 64:128:512:0")
    count, lo, hi = (int(g) for g in m.groups()[:3])
    seed = int(m.group(4)) if m.group(4) is not None else 0
    if not 1 <= count <= MAX_GROUP:
        raise AdvisorError(f"group {text!r}: COUNT must be between 1 and {MAX_GROUP}")
    if not 1 <= lo <= hi < 2**31:
        raise AdvisorError(f"group {text!r}: need 1 <= LO <= HI < 2^31")
    if -(-lo // _GROUP_MULTIPLE) * _GROUP_MULTIPLE > hi:
        raise AdvisorError(f"group {text!r}: sizes are drawn on multiples of {_GROUP_MULTIPLE} (as the bench does); "
                           f"LO..HI must contain one")
    return {"count": count, "lo": lo, "hi": hi, "seed": seed}


def group_sizes(group: dict[str, int]) -> list[tuple[int, int, int]]:
    """The (M, N, K) list for a parse_group() result, drawn by the bench's own function (so
    the same COUNT:LO:HI:SEED gives the same GEMMs as bench/bench_gemm.py --grouped)."""
    from ..basics import group_sizes as draw

    return [tuple(s) for s in draw(group["count"], group["lo"], group["hi"], group["seed"], multiple=_GROUP_MULTIPLE)]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'17x33x70,64x48x128' -> [(17, 33, 70), (64, 48, 128)]."""
    items = str(text).split(",")
    if len(items) > MAX_GROUP:
        raise AdvisorError(f"shapes: {len(items)} GEMMs, at most {MAX_GROUP}")
    return [parse_shape(s) for s in items]


def _grouped_knobs(sizes: list[tuple[int, int, int]], dtype: str, dev: Device) -> tuple[dict[str, Any], dict[str, Any]]:
    """The schedule's default_config for this group (needs torch and triton to import it);
    without them the Config defaults, with block_k halved for fp32 (block_k x 4 bytes: the
    fp32 search space's k-step; 64 would not fit two programs per SM)."""
    device_model = {"gpu": dev.name, "sm_count": dev.sm_count}
    try:
        import torch  # noqa: F401  (the probe: no torch, ImportError)

        from .kernel_lib import load

        mod = load(GROUPED)
    except ImportError:
        base = _defaults(GROUPED)
        if dtype == "fp32" and "block_k" in base:
            base["block_k"] = base["block_k"] // 2
        return base, {"how": "defaults", "candidates_from": "the schedule's Config defaults (torch/triton not importable here)",
                      "device_model": device_model}
    from dataclasses import asdict

    tdtype = torch_dtype(dtype)
    cfg = mod.default_config(sizes, tdtype, dev.sm_count)
    chosen = {"how": "the schedule's default_config", "candidates_from": "its search space for this group",
              "device_model": device_model}
    return asdict(cfg), chosen


def generate_grouped(
    sizes: list[tuple[int, int, int]],
    dtype: str = "bf16",
    knobs: dict[str, Any] | None = None,
    *,
    group: dict[str, int] | None = None,
    finding: dict[str, Any] | None = None,
    device: Device | None = None,
    tuned_for: dict[str, Any] | None = None,
    chosen_by: dict[str, Any] | None = None,
    path: str | Path | None = None,
) -> Variant:
    """Render the grouped-GEMM variant (kernels/grouped_gemm.py inlined) for the GEMMs in
    `sizes` ([(M, N, K), ...]); write it to `path` when given. The knobs are the schedule's
    default_config for the group, overridden knob by knob by `knobs`. `group` (from
    parse_group) records how the first group["count"] sizes were drawn; `chosen_by` replaces
    the record of how the knobs were chosen (advisor.run.loop: measured on this GPU)."""
    sizes = [tuple(s) for s in (sizes or [])]
    if not sizes:
        raise AdvisorError("grouped: no GEMMs; give --group COUNT:LO:HI[:SEED] and/or --shapes MxNxK,...")
    if len(sizes) > MAX_GROUP:
        raise AdvisorError(f"grouped: {len(sizes)} GEMMs, at most {MAX_GROUP}")
    for s in sizes:
        if len(s) != 3:
            raise AdvisorError(f"grouped: {s!r} is not an (M, N, K) triple")
        _check_problem(*s, dtype)
    sizes = [tuple(int(x) for x in s) for s in sizes]
    dev = device or Device()
    final, modelled = _grouped_knobs(sizes, dtype, dev)
    if knobs:
        final.update(coerce_knobs(GROUPED, knobs))
        modelled = dict(modelled, overridden=sorted(knobs))
    chosen_by = chosen_by or modelled  # a caller that measured the knobs says so
    final = coerce_knobs(GROUPED, final)
    _check_config(GROUPED, final, dtype)
    source, _ = bundle(GROUPED)
    dims = [d for s in sizes for d in s]
    text, filename, target = _render(
        "grouped.py.j2", path, strategy=GROUPED, dtype=dtype, knobs=final, finding=finding, source=source,
        tuned_for=tuned_for, chosen_by=chosen_by,
        count=len(sizes),
        dim_lo=min(dims),
        dim_hi=max(dims),
        sizes=[list(s) for s in sizes],
        group=dict(group) if group else None,
    )
    M, N, K = (max(s[i] for s in sizes) for i in range(3))
    variant = Variant(GROUPED, M, N, K, dtype, final, chosen_by, text, sizes=sizes)
    return _finish(variant, filename, target)


def finding_summary(f: Any) -> dict[str, Any]:
    """The parts of a Finding worth recording in a variant header (plain data only)."""
    d = f.to_dict() if hasattr(f, "to_dict") else dict(f)
    keep = ("symptom", "strategy", "kernel", "rank", "device_id", "shape", "grid", "launches", "total_ns", "est_savings_ns", "confidence", "evidence", "suggestion")
    return {k: d.get(k) for k in keep}


COMMON_WORLD_SIZES = (2, 4, 8)  # GPUs a tensor-parallel group usually spans (one node)


def comm_shape_warnings(pattern: str, M: int, K: int) -> list[str]:
    """The common world sizes the generated script will refuse for this shape. Its ranks
    split M evenly (all_gather_matmul gathers equal row blocks; reduce-scatter hands out
    equal ones), and matmul_reduce_scatter's inputs K too; the world size is torchrun's,
    known only at run time, so this warns rather than refuses."""
    dims = {"M": M} if pattern == "all_gather_matmul" else {"M": M, "K": K}
    fails = {k: [str(w) for w in COMMON_WORLD_SIZES if v % w] for k, v in dims.items()}
    bad = [str(w) for w in COMMON_WORLD_SIZES if any(v % w for v in dims.values())]
    if not bad:
        return []
    good = [str(w) for w in COMMON_WORLD_SIZES if str(w) not in bad]
    why = " and ".join(f"{k}={dims[k]} is not divisible by {', '.join(f)}" for k, f in fails.items() if f)
    fits = f"use {' or '.join(good)}" if good else "pick a shape the GPU count divides"
    return [(f"{pattern} splits {' and '.join(dims)} evenly over the ranks and {why}: the script will stop with an "
             f"error under torchrun --nproc-per-node {', '.join(bad)} ({fits})")]


def generate_comm_overlap(
    pattern: str,
    M: int,
    N: int,
    K: int,
    dtype: str = "bf16",
    knobs: dict[str, Any] | None = None,
    *,
    finding: dict[str, Any] | None = None,
    path: str | Path | None = None,
) -> Variant:
    """Render a torchrun-launched variant of the overlapped tensor-parallel schedule
    (kernels/comm_overlap.py) with a check against the plain sequence and a benchmark."""
    if pattern not in COMM_PATTERNS:
        raise AdvisorError(f"pattern {pattern!r}: use one of {', '.join(COMM_PATTERNS)}")
    _check_problem(M, N, K, dtype)
    final = _defaults("comm_overlap")
    if knobs:
        final.update(coerce_knobs("comm_overlap", knobs))
    final = coerce_knobs("comm_overlap", final)
    _check_config("comm_overlap", final, dtype)
    source, _ = bundle("comm_overlap")
    text, filename, target = _render(
        "comm_overlap.py.j2", path, dtype=dtype, knobs=final, finding=finding, source=source,
        pattern=pattern,
        pattern_id=_ident(pattern, "pattern"),
        M=M,
        N=N,
        K=K,
    )
    chosen = {"how": "defaults" if not knobs else "given", "pattern": pattern}
    variant = Variant("comm_overlap", M, N, K, dtype, final, chosen, text, warnings=comm_shape_warnings(pattern, M, K))
    return _finish(variant, filename, target)


MAX_LQ = 16  # query positions the schedule takes (decode, speculative verify steps)


def parse_attn(text: str) -> dict[str, int]:
    """'1:32:8:128:32768' or '1:32:8:128:32768:4' -> {"B", "Hq", "Hkv", "D", "S", "Lq"}
    (B:HQ:HKV:D:S[:LQ], Lq 1 unless given), checked as the schedule checks its inputs."""
    m = re.fullmatch(r"\s*(\d{1,10}):(\d{1,10}):(\d{1,10}):(\d{1,10}):(\d{1,10})(?::(\d{1,10}))?\s*", str(text))
    if not m:
        raise AdvisorError(f"attn {text!r}: expected B:HQ:HKV:D:S[:LQ] integers, e.g. 1:32:8:128:32768")
    B, Hq, Hkv, D, S = (int(g) for g in m.groups()[:5])
    Lq = int(m.group(6)) if m.group(6) is not None else 1
    return check_attn({"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "S": S, "Lq": Lq}, what=f"attn {text!r}")


def check_attn(shape: dict[str, Any], what: str = "attention shape") -> dict[str, int]:
    """The decode-attention problem as validated integers (what reaches generated code)."""
    out = {}
    for key in ("B", "Hq", "Hkv", "D", "S", "Lq"):
        v = shape.get(key, 1 if key == "Lq" else None)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2**31:
            raise AdvisorError(f"{what}: {key}={v!r} must be an integer in 1..2^31-1")
        out[key] = v
    if out["Hq"] % out["Hkv"]:
        raise AdvisorError(f"{what}: query heads {out['Hq']} must be a multiple of kv heads {out['Hkv']}")
    if not 16 <= out["D"] <= 256:
        raise AdvisorError(f"{what}: head_dim {out['D']} must be 16..256")
    if not 1 <= out["Lq"] <= MAX_LQ:
        raise AdvisorError(f"{what}: query length {out['Lq']} must be 1..{MAX_LQ} (decode)")
    if out["S"] < out["Lq"]:
        raise AdvisorError(f"{what}: KV length {out['S']} < query length {out['Lq']}")
    if out["B"] * out["Hkv"] * out["S"] * out["D"] >= 2**40:
        raise AdvisorError(f"{what}: K alone would hold {out['B'] * out['Hkv'] * out['S'] * out['D']:,} elements")
    return out


def _split_kv_knobs(shape: dict[str, int], dtype: str, dev: Device) -> tuple[dict[str, Any], dict[str, Any]]:
    """The schedule's default_config for the shape (needs torch and triton to import it); without
    them the Config defaults with the split count of the same wave rule (advisor.attention)."""
    device_model = {"gpu": dev.name, "sm_count": dev.sm_count}
    args = (shape["B"], shape["Hq"], shape["Hkv"], shape["Lq"], shape["S"], shape["D"])
    try:
        import torch  # noqa: F401  (the probe: no torch, ImportError)

        from .kernel_lib import load

        mod = load(SPLIT_KV)
    except ImportError:
        from ..symptoms.attention import num_splits_for

        base = _defaults(SPLIT_KV)
        units = _attn_units(shape, base["BLOCK_H"])
        base["NUM_SPLITS"] = num_splits_for(units, dev.sm_count * base["CTAS_PER_SM"], -(-shape["S"] // base["MIN_CHUNK"]))
        return base, {"how": "defaults + the wave rule", "device_model": device_model,
                      "candidates_from": "the schedule's Config defaults (torch/triton not importable here)"}
    from dataclasses import asdict

    tdtype = torch_dtype(dtype)
    cfg = mod.default_config(*args, tdtype, dev.sm_count)
    return asdict(cfg), {"how": "the schedule's default_config", "device_model": device_model,
                         "candidates_from": "its tile rules and the wave-efficiency split rule"}


def _attn_units(shape: dict[str, int], block_h: int) -> int:
    """Programs one split of the split-KV kernel launches (kernels/split_kv_tuning.py's
    work_units: pure Python, so no torch needed)."""
    from .kernel_lib import load

    return load("split_kv_tuning").work_units(shape["B"], shape["Hq"], shape["Hkv"], shape["Lq"], block_h)


def _switch_schedule(final: dict[str, Any], asked: dict[str, Any], shape: dict[str, int], dev: Device) -> None:
    """Make `final` (the default's knobs) fit what the user asked for with --config when that
    names the other schedule: stream=true, or a split knob (stream=false, a split count, the
    combine kernel, PDL) on a stream default. The other schedule's grid at about the same
    programs per SM; what the user set explicitly is applied after (Config says if it conflicts)."""
    split_asked = asked.get("stream") is False or ("stream" not in asked and bool(
        asked.get("NUM_SPLITS") or asked.get("combine") == "kernel" or asked.get("pdl")))
    if asked.get("stream") and not final.get("stream"):
        final.update(stream=True, NUM_SPLITS=0, combine="last_arriver", pdl=False)
    elif split_asked and final.get("stream"):
        from .kernel_lib import load

        fill_splits = load("split_kv_tuning").fill_splits
        final.update(stream=False, NUM_SPLITS=fill_splits(_attn_units(shape, final["BLOCK_H"]), dev.sm_count,
                                                          final["CTAS_PER_SM"], shape["S"]))


def generate_split_kv(
    shape: dict[str, int],
    dtype: str = "bf16",
    knobs: dict[str, Any] | None = None,
    *,
    finding: dict[str, Any] | None = None,
    device: Device | None = None,
    tuned_for: dict[str, Any] | None = None,
    chosen_by: dict[str, Any] | None = None,
    path: str | Path | None = None,
) -> Variant:
    """Render the split-KV decode-attention variant (kernels/split_kv_attention.py inlined) for
    `shape` ({"B", "Hq", "Hkv", "D", "S", "Lq"}, e.g. from parse_attn); write it to `path` when
    given. Knobs: the schedule's default_config for the shape, overridden knob by knob."""
    if dtype not in DTYPES:
        raise AdvisorError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    shape = check_attn(dict(shape))
    dev = device or Device()
    final, modelled = _split_kv_knobs(shape, dtype, dev)
    if knobs:
        asked = coerce_knobs(SPLIT_KV, knobs)
        _switch_schedule(final, asked, shape, dev)
        final.update(asked)
        modelled = dict(modelled, overridden=sorted(knobs))
    chosen_by = chosen_by or modelled
    final = coerce_knobs(SPLIT_KV, final)
    try:
        import torch  # noqa: F401  (the probe: no torch, ImportError)

        from .kernel_lib import load

        cfg = load(SPLIT_KV).Config(**final)
        tdtype = torch_dtype(dtype)
        if cfg.smem_bytes(shape["D"], tdtype) > 227 * 1024:
            raise ValueError(f"num_stages={cfg.num_stages}: K/V pipeline needs {cfg.smem_bytes(shape['D'], tdtype):,} bytes "
                             f"of shared memory, over the 227 KB of an sm_90 block")
    except ImportError:
        pass
    except (TypeError, ValueError) as exc:
        raise AdvisorError(f"{SPLIT_KV} knobs: {exc}") from None
    source, _ = bundle(SPLIT_KV)
    text, filename, target = _render(
        "split_kv.py.j2", path, strategy=SPLIT_KV, dtype=dtype, knobs=final, finding=finding, source=source,
        tuned_for=tuned_for, chosen_by=chosen_by,
        attn=shape,
    )
    # M, N, K of a Variant are a GEMM's; here the rows of queries, head_dim and the KV length
    variant = Variant(SPLIT_KV, shape["B"] * shape["Hq"] * shape["Lq"], shape["D"], shape["S"], dtype, final,
                      chosen_by, text, attn=shape)
    return _finish(variant, filename, target)


# ------------------------------------------------------------------ the one front door (CLI, agents)


@dataclass
class Written:
    """What `write_variant` wrote: the variant, the lines that tell a person what it is and what
    to run next, and warnings (stderr)."""

    variant: Any
    lines: list[str]
    warnings: list[str] = field(default_factory=list)


def _chosen_by(chosen: dict) -> str:
    """How a generated variant's knobs were chosen, with the ones --config replaced."""
    text = f"{chosen.get('how')} ({chosen.get('candidates_from', 'given')})"
    if chosen.get("overridden"):
        text += f"; set by --config: {', '.join(chosen['overridden'])}"
    return text


def _knob_lines(v) -> list[str]:
    return ["knobs: " + ", ".join(f"{k}={val}" for k, val in v.knobs.items())]


def write_variant(strategy: str, path: Path, *, shape: str | None = None, attn: str | None = None,
                  group: str | None = None, shapes: str | None = None, dtype: str = "bf16",
                  knobs: dict[str, object] | None = None, sm_count: int | None = None,
                  pattern: str = "all_gather_matmul") -> Written:
    """Write the standalone variant of `strategy` to `path` from the problem as a person states
    it (`shape` "MxNxK"; split_kv's `attn` "B:HQ:HKV:D:S[:LQ]"; grouped's `group`
    "COUNT:LO:HI[:SEED]" and/or `shapes` "MxNxK,..."): checks that the arguments fit the
    strategy, generates, and says what was written and what to run next."""
    from ..textutil import safe_text, shell_quote

    knobs = dict(knobs or {})
    device = Device(sm_count=sm_count) if sm_count else Device()
    shown, quoted = safe_text(path, 400), shell_quote(path)
    if (attn is not None) != (strategy == SPLIT_KV):
        raise AdvisorError("generate split_kv needs --attn B:HQ:HKV:D:S[:LQ], e.g. --attn 1:32:8:128:32768"
                           if attn is None else f"--attn is for the split_kv strategy; {strategy} takes --shape MxNxK")
    if strategy == SPLIT_KV:
        if shape is not None or group is not None or shapes is not None:
            raise AdvisorError("generate split_kv takes --attn B:HQ:HKV:D:S[:LQ], not --shape/--group/--shapes")
        v = generate_split_kv(parse_attn(attn), dtype=dtype, knobs=knobs, device=device, path=path)
        a = v.attn
        return Written(v, [f"wrote {shown} (split_kv, B={a['B']} Hq={a['Hq']} Hkv={a['Hkv']} D={a['D']} S={a['S']} "
                           f"Lq={a['Lq']} {dtype})", *_knob_lines(v), f"chosen by: {_chosen_by(v.chosen_by)}",
                           f"next: python {quoted} --check   (then --bench on the GPU: vs torch SDPA's flash, cuDNN "
                           "and math backends)"])
    if strategy == GROUPED:
        if shape is not None:
            raise AdvisorError("generate grouped takes --group COUNT:LO:HI[:SEED] and/or --shapes MxNxK,..., not --shape")
        if group is None and shapes is None:
            raise AdvisorError("generate grouped needs --group COUNT:LO:HI[:SEED] (e.g. 64:128:512:0) "
                               "and/or --shapes MxNxK,MxNxK,...")
        spec = parse_group(group) if group is not None else None
        sizes = (group_sizes(spec) if spec else []) + (parse_shapes(shapes) if shapes is not None else [])
        v = generate_grouped(sizes, dtype=dtype, knobs=knobs, group=spec, device=device, path=path)
        lo, hi = min(min(s) for s in sizes), max(max(s) for s in sizes)
        return Written(v, [f"wrote {shown} (grouped, {len(sizes)} GEMMs, M/N/K in {lo}..{hi}, {dtype})",
                           *_knob_lines(v), f"chosen by: {_chosen_by(v.chosen_by)}",
                           f"next: python {quoted} --check   (then --bench on the GPU: vs a torch.matmul loop and its "
                           "CUDA graph)"])
    if group is not None or shapes is not None:
        raise AdvisorError(f"--group and --shapes are for the grouped strategy; {strategy} takes --shape MxNxK")
    if shape is None:
        raise AdvisorError(f"generate {strategy} needs --shape MxNxK, e.g. --shape 4096x4096x8192")
    M, N, K = parse_shape(shape)
    if strategy == COMM_OVERLAP:
        v = generate_comm_overlap(pattern, M, N, K, dtype=dtype, knobs=knobs, path=path)
        lines = [f"wrote {shown} (comm_overlap {pattern}, {M}x{N}x{K} {dtype})", *_knob_lines(v)]
        if v.knobs.get("transport") == "nccl" and "transport" not in knobs:
            lines.append("tip: transport=nccl runs anywhere; on GPUs with peer access (NVLink) --config transport=p2p "
                         "(copy engines, no SMs taken from the GEMM) was 1.0-1.5x faster than NCCL chunks on 2 H200s, "
                         "graph-replayed (docs/schedules/comm_overlap.md)")
        lines.append(f"next: torchrun --nproc-per-node <GPUs> {quoted} --check --bench --graph   (--graph: time "
                     "CUDA-graph replays; eager chunks can wait on the host)")
        return Written(v, lines, list(v.warnings))
    v = generate(strategy, M, N, K, dtype=dtype, knobs=knobs, device=device, path=path)
    lines = [f"wrote {shown} ({strategy}, {M}x{N}x{K} {dtype})", *_knob_lines(v), f"chosen by: {_chosen_by(v.chosen_by)}"]
    if strategy == "warp_specialization" and v.knobs.get("warp_specialize") is False and "warp_specialize" not in knobs:
        lines.append("note: this config runs the TMA pipeline without producer/consumer warp groups: the model ranked "
                     "it first for this shape (Triton 3.6's warp specialization does not compile for fp32 with a "
                     "row-major B, and was wrong at 6-8 stages on the H200); --config warp_specialize=true forces it")
    if strategy == "cluster_gemm":
        from .kernel_lib import load

        why = load("cluster_gemm").unavailable_reason()
        if why:
            lines.append(f"note: {why}: the file runs where Triton >= 3.9 is installed, on an sm_90 GPU")
    lines.append(f"next: python {quoted} --check   (then --bench on the GPU)")
    return Written(v, lines)
