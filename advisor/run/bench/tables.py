"""Tables derived from measurement rows: best per provider, speedups, geometric means.

Pure functions of row lists (see rows.py); nothing here measures or prints. The rules:

* Only rows with status "ok" and a time count. A provider whose winner was re-checked and
  re-timed (phase "final") is judged by that final measurement; if its final re-check
  failed, the provider has no result for that shape: a variant that failed a check is
  never a winner.
* Speedup of P over baseline B on a shape = B's best median / P's best median (> 1: P is
  faster). Suite summaries are geometric means over the shapes where both were measured.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

Key = tuple  # (suite, shape, dtype)


def _ok(r: dict) -> bool:
    t = r.get("median_us")
    return r.get("status") == "ok" and isinstance(t, (int, float)) and math.isfinite(t) and t > 0


def row_key(r: dict) -> Key:
    return (r.get("suite"), r.get("shape"), r.get("dtype"))


def geomean(values: Iterable[float]) -> float | None:
    """exp(mean(log x)) of positive finite values; None when there are none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def latest_runs(rows: Sequence[dict]) -> list[dict]:
    """Keep, for each (suite, shape, dtype), only the rows of the most recent run that
    measured it (runs ordered by their latest date), so appended history does not mix."""
    last_date: dict[str, str] = {}
    for r in rows:
        rid = r.get("run_id") or ""
        d = str(r.get("date") or "")
        if d > last_date.get(rid, ""):
            last_date[rid] = d
    chosen: dict[Key, str] = {}
    for r in rows:
        rid = r.get("run_id") or ""
        k = row_key(r)
        cur = chosen.get(k)
        if cur is None or (last_date.get(rid, ""), rid) > (last_date.get(cur, ""), cur):
            chosen[k] = rid
    return [r for r in rows if (r.get("run_id") or "") == chosen[row_key(r)]]


def best_per_provider(rows: Sequence[dict]) -> dict[Key, dict[str, dict]]:
    """{(suite, shape, dtype): {provider: best ok row}} under the rules in the module doc."""
    by: dict[Key, dict[str, list[dict]]] = {}
    for r in rows:
        by.setdefault(row_key(r), {}).setdefault(r.get("provider"), []).append(r)
    out: dict[Key, dict[str, dict]] = {}
    for key, provs in by.items():
        for prov, rs in provs.items():
            finals = [r for r in rs if r.get("phase") == "final"]
            pool = finals if finals else rs
            ok = [r for r in pool if _ok(r)]
            if finals and len(ok) < len(finals):
                continue  # the winner failed its re-check: no result for this provider
            if ok:
                out.setdefault(key, {})[prov] = min(ok, key=lambda r: r["median_us"])
    return out


def speedup_table(rows: Sequence[dict], baselines: Sequence[str] = ("torch.matmul", "dp")) -> list[dict]:
    """One dict per (suite, shape, dtype, provider) with its best time and its speedup
    over each baseline (`vs_<baseline>`, None where the baseline has no result), and
    its time over the HBM floor (`x_floor`) where the floor was measured."""
    best = best_per_provider(rows)
    table = []
    for (suite, shape, dtype), provs in best.items():
        for prov, r in provs.items():
            entry = {
                "suite": suite, "shape": shape, "dtype": dtype, "provider": prov,
                "config": r.get("config", ""), "median_us": r["median_us"],
                "tflops": r.get("tflops"), "rel_err": r.get("rel_err"),
                "M": r.get("M"), "N": r.get("N"), "K": r.get("K"),
            }
            for b in baselines:
                base = provs.get(b)
                entry[f"vs_{b}"] = base["median_us"] / r["median_us"] if base else None
            floor = r.get("hbm_floor_us")
            entry["x_floor"] = r["median_us"] / floor if isinstance(floor, (int, float)) and floor else None
            table.append(entry)
    return table


def _config_key(row: dict) -> tuple[str, str]:
    return row.get("provider", ""), row.get("config") or ""


def best_rows(rows: Sequence[dict]) -> dict[str, dict]:
    """Each provider's best verified row (under `_key`): final (re-checked, re-timed) rows
    before search rows, then the fastest; a config whose final re-check failed never counts."""
    best: dict[str, dict] = {}
    refuted = final_failures(rows)
    for r in rows:
        if r.get("status") != "ok" or not r.get("median_us") or _config_key(r) in refuted:
            continue
        key = (0 if r.get("phase") == "final" else 1, float(r["median_us"]))
        if r["provider"] not in best or key < best[r["provider"]]["_key"]:
            best[r["provider"]] = dict(r, _key=key)
    return best


def final_failures(rows: Sequence[dict]) -> set[tuple[str, str]]:
    """(provider, config) pairs whose final re-check failed: their earlier passing search rows
    must not stand in for them (a check on a fresh input set that fails is a real failure)."""
    return {_config_key(r) for r in rows if r.get("phase") == "final" and r.get("status") != "ok"}


def best_of(table: Sequence[dict], providers: Sequence[str], label: str | None = None) -> list[dict]:
    """Per (suite, shape, dtype), the fastest entry among `providers` (a "best of ours"
    row), renamed to `label` when given. Shapes where none of them has a result are left out."""
    groups: dict[Key, list[dict]] = {}
    for e in table:
        if e["provider"] in providers:
            groups.setdefault((e["suite"], e["shape"], e["dtype"]), []).append(e)
    out = []
    for _, es in groups.items():
        e = dict(min(es, key=lambda x: x["median_us"]))
        e["winner"] = e["provider"]
        if label:
            e["provider"] = label
        out.append(e)
    return out


def suite_geomeans(table: Sequence[dict], metric: str) -> dict[tuple, dict]:
    """{(suite, dtype, provider): {"geomean": g, "n": shapes}} of `metric` (e.g. "vs_dp")."""
    acc: dict[tuple, list[float]] = {}
    for e in table:
        v = e.get(metric)
        if v is not None:
            acc.setdefault((e["suite"], e["dtype"], e["provider"]), []).append(v)
    return {k: {"geomean": geomean(v), "n": len(v)} for k, v in acc.items()}


def failures(rows: Sequence[dict]) -> list[dict]:
    """Rows that did not produce a valid measurement, other than plain budget skips."""
    return [r for r in rows if r.get("status") not in ("ok", "skipped")]


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------


def _md_cell(v, fmt: str | None) -> str:
    if v is None or v == "":
        return "-"
    if fmt and isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return format(v, fmt)
    s = " ".join(str(v).split())
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def markdown_table(entries: Sequence[dict], columns: Sequence[tuple]) -> str:
    """A GitHub markdown table. `columns` are (key, header[, format spec]) tuples;
    text cells are escaped (pipes, angle brackets) since some come from error messages."""
    heads = [c[1] for c in columns]
    lines = ["| " + " | ".join(heads) + " |", "| " + " | ".join("---" for _ in heads) + " |"]
    for e in entries:
        cells = [_md_cell(e.get(c[0]), c[2] if len(c) > 2 else None) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# Display order of providers in tables: baselines first, then ours.
PROVIDER_ORDER = ["torch.matmul", "cuda_graph", "torch._grouped_mm", "torch._grouped_mm[padded]", "dp",
                  "split_k", "persistent", "stream_k", "warp_specialization", "grouped"]


def provider_order(p: str) -> tuple:
    return (PROVIDER_ORDER.index(p) if p in PROVIDER_ORDER else len(PROVIDER_ORDER), p)


def shape_order(shape: str) -> tuple:
    """Sort "MxNxK" numerically; other labels after, alphabetically."""
    try:
        return (0,) + tuple(int(x) for x in str(shape).split("x"))
    except ValueError:
        return (1, str(shape))


def repeatability(rows: Sequence[dict], dtype: str) -> float | None:
    """Largest relative difference between torch.matmul's two timings (search, final) of a
    shape: a difference between providers smaller than this is noise."""
    by: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("provider") == "torch.matmul" and r.get("dtype") == dtype and _ok(r):
            by.setdefault(r["shape"], {})[r.get("phase")] = r["median_us"]
    diffs = [abs(v["search"] - v["final"]) / v["final"] for v in by.values() if "search" in v and "final" in v]
    return max(diffs) if diffs else None


def suite_markdown(rows: Sequence[dict], suite: str) -> str:
    """Per dtype: every provider's best verified time per shape with TFLOP/s, speedups over
    torch.matmul and dp (grouped: over the CUDA-graph loop), time over the HBM floor where
    measured, error and config; then the geometric means per provider."""
    srows = [r for r in rows if r.get("suite") == suite]
    second = "cuda_graph" if suite == "grouped" else "dp"
    table = speedup_table(srows, baselines=("torch.matmul", second))
    out = []
    for dtype in sorted({e["dtype"] for e in table}):
        entries = sorted((e for e in table if e["dtype"] == dtype),
                         key=lambda e: (shape_order(e["shape"]), provider_order(e["provider"])))
        cols = [("shape", "shape"), ("provider", "provider"), ("median_us", "median us", ".1f"),
                ("tflops", "TFLOP/s", ".1f"), ("vs_torch.matmul", "vs torch.matmul", ".2f"),
                (f"vs_{second}", "vs CUDA graph" if second == "cuda_graph" else "vs dp", ".2f")]
        if any(e.get("x_floor") for e in entries):
            cols.append(("x_floor", "x HBM floor", ".2f"))
        cols += [("rel_err", "rel err", ".1e"), ("config", "config")]
        out.append(f"\n### {suite}, {dtype}\n\n")
        out.append(markdown_table(entries, cols))
        spread = repeatability(srows, dtype)
        if spread is not None:
            out.append(f"\nRepeatability: torch.matmul timed twice per shape (search, then final) differed by "
                       f"at most {spread:.1%}; speedups closer to 1 than that are noise.\n")
        geo = []
        for metric in ("vs_torch.matmul", f"vs_{second}"):
            for (_, _, p), g in suite_geomeans(entries, metric).items():
                geo.append({"provider": p, "metric": metric.replace("vs_", "vs "), "geomean": g["geomean"],
                            "n": g["n"]})
        geo.sort(key=lambda g: (g["metric"], provider_order(g["provider"])))
        if geo:
            out.append("\nGeometric means over the shapes where both were measured:\n\n")
            out.append(markdown_table(geo, [("provider", "provider"), ("metric", "speedup"),
                                            ("geomean", "geomean", ".3f"), ("n", "shapes")]))
    return "".join(out) + "\n"


def summary_markdown(rows: Sequence[dict]) -> str:
    """suite_markdown for every suite in `rows` (ceiling and timer-check rows left out)."""
    suites = sorted({r.get("suite") for r in rows} - {"ceiling", "timer_check", None})
    return "".join(f"## {s}\n" + suite_markdown(rows, s) for s in suites)


def text_table(entries: Sequence[dict], columns: Sequence[tuple]) -> str:
    """The same table as fixed-width text, for a terminal."""
    heads = [c[1] for c in columns]
    body = [[_md_cell(e.get(c[0]), c[2] if len(c) > 2 else None).replace("\\|", "|") for c in columns]
            for e in entries]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(heads)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return "\n".join([fmt.format(*heads)] + [fmt.format(*r) for r in body]) + "\n"
