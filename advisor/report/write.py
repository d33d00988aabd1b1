"""The reports each command leaves: markdown and JSON of a diagnosis, a comparison and a --run,
and the plain text of `advisor summary` and `advisor rules`.

    from advisor.report.write import write_diagnosis
    markdown = write_diagnosis(diagnose(trace), Path("report"))   # report.md, report.json, waves.png

The CLI and `advisor optimize` call these, so a report reads the same whichever wrote it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..safeio import write_file
from ..textutil import cap_strings, fmt_bytes, fmt_ns, safe_text


def json_text(obj: Any) -> str:
    """JSON text of a report: trace-derived strings (kernel names, NVTX text) longer than
    textutil.JSON_STRING_CHARS are cut, with a marker saying how long they were (a trace with
    200 MB names made a 419 MB report.json)."""
    return json.dumps(cap_strings(obj), indent=2, default=str)


def diagnosis_markdown(d, images: dict[str, str] | None = None) -> str:
    from .render import render

    return render("diagnosis.md.j2", d=d, images=images or {})


def write_diagnosis(d, out_dir: Path, *, waves: bool = True) -> str:
    """report.md and report.json of diagnosis `d` into `out_dir` (created), with waves.png
    beside them when `waves` and matplotlib is installed; returns the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    images = {}
    if waves:
        from .plots import wave_occupancy

        if wave_occupancy(d.findings, out_dir / "waves.png") is not None:
            images["waves"] = "waves.png"
    markdown = diagnosis_markdown(d, images)
    write_file(out_dir / "report.md", markdown)
    write_file(out_dir / "report.json", json_text(d.to_dict()))
    return markdown


def comparison_markdown(payload: dict, top: int = 15) -> str:
    """The markdown of a Comparison's to_dict(), `top` kernels listed."""
    from .render import render

    return render("compare.md.j2", d=payload, top=top)


def write_comparison(payload: dict, out_dir: Path, *, top: int = 15) -> str:
    """compare.md and compare.json of a Comparison's to_dict() into `out_dir` (created); returns
    the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = comparison_markdown(payload, top)
    write_file(out_dir / "compare.md", markdown)
    write_file(out_dir / "compare.json", json_text(payload))
    return markdown


def run_report(results: Sequence, out_dir: Path, *, device: dict | None = None, versions: dict | None = None,
               rules=None, skipped: Sequence = (), date: str | None = None) -> str:
    """before_after.png (with matplotlib), run_report.md and run_report.json for the results of
    the --run loops (each has .rows, .table(), .to_dict()) into `out_dir`; returns the markdown.
    `device` and `versions` describe the GPU the rows ran on (None: they did not run)."""
    import datetime as _dt

    from .plots import before_after
    from .render import render

    out_dir.mkdir(parents=True, exist_ok=True)
    images = {}
    if any(r.rows for r in results):
        table_rows = [dict(t, shape=r.shape) for r in results for t in r.table() if t["median_us"]]
        if before_after([dict(t, status="ok") for t in table_rows], out_dir / "before_after.png") is not None:
            images["bars"] = "before_after.png"
    md = render("run_report.md.j2", results=results, device=device, versions=versions or {}, rules=rules or {},
                images=images, skipped=skipped, date=date or _dt.date.today().isoformat())
    write_file(out_dir / "run_report.md", md)
    payload = {"device": device, "results": [r.to_dict() for r in results], "skipped": [s.to_dict() for s in skipped]}
    write_file(out_dir / "run_report.json", json_text(payload))
    return md


def summary_text(info: dict) -> str:
    """`advisor summary` as text, from summarize()'s dict."""
    lines = []
    fmt = info["format"]
    lines.append(f"format: {', '.join(map(str, fmt)) if isinstance(fmt, list) else fmt}")
    lines.append(f"sources: {', '.join(safe_text(s) for s in info['sources'])}")
    for d in info["devices"]:
        sms = d["sm_count"] if d["sm_count"] is not None else "?"
        lines.append(
            f"device: rank {d['rank']} #{d['device_id']} {safe_text(d['name'] or 'unknown')}"
            f" | SMs {sms} ({d['sm_count_source']}) | cc {d['compute_capability'] or '?'}"
        )
    k = info["kernels"]
    lines.append(
        f"kernels: {k['count']} launches, {k['distinct']} distinct, GPU time {fmt_ns(k['total_ns'])}"
        f" over a span of {fmt_ns(k['span_ns'])}"
    )
    lines.append(
        f"nvtx ranges: {info['nvtx']['count']} | cpu ops: {info['cpu_ops']['count']}"
        f" | runtime calls: {info['runtime']['count']}"
    )
    m = info["memcpy"]
    lines.append(f"memcpy/memset: {m['count']} ops, {fmt_ns(m['total_ns'])}, {fmt_bytes(m['bytes'])}")
    if info["top_kernels"]:
        lines.append("")
        # one row per (name, grid, block, shape): a name launched several ways has several rows
        lines.append(f"{'total':>10} {'count':>7} {'median':>10}  {'grid':<16} {'block':<13} {'regs':>4} {'smem':>9}  "
                     f"{'shape':<22} name")
        for t in info["top_kernels"]:
            grid = "x".join("?" if v is None else str(v) for v in t["grid"])
            s = t.get("shape")
            shape = f"{s['M']}x{s['N']}x{s['K']}" + (f" {s['dtype']}" if s.get("dtype") else "") if s else "-"
            block = "x".join("?" if v is None else str(v) for v in t["block"])
            regs = "?" if t["registers_per_thread"] is None else t["registers_per_thread"]
            smem = "?" if t["shared_mem_bytes"] is None else fmt_bytes(t["shared_mem_bytes"])
            lines.append(
                f"{fmt_ns(t['total_ns']):>10} {t['count']:>7} {fmt_ns(t['median_ns']):>10}  {grid:<16} {block:<13} {regs:>4} {smem:>9}  {safe_text(shape, 22):<22} {safe_text(t['name'], 100)}"
            )
    for n in info["notes"]:
        lines.append(f"note: {safe_text(n, 300)}")
    return "\n".join(lines) + "\n"


def rules_text(table: list[dict]) -> str:
    """`advisor rules` as text, from rules_table()'s rows: each rule and every threshold with
    the reason for its value."""
    lines = []
    for r in table:
        state = "" if r["enabled"] else "  [disabled]"
        lines.append(f"{r['symptom']} -> {r['strategy']}{state}   ({r['source']})")
        lines.append(f"  {r['title']}")
        lines.append(f"  try first: {r['try_first']}")
        lines.append(f"  watch for: {r['watch_for']}")
        if r["strategies"]:
            lines.append(f"  strategy by pattern: {', '.join(f'{k} -> {v}' for k, v in r['strategies'].items())}")
        for strategy, text in (r.get("try_first_by_strategy") or {}).items():
            lines.append(f"  try first for {strategy}: {text}")
        for name, t in r["thresholds"].items():
            unit = f" {t['unit']}" if t["unit"] else ""
            lines.append(f"    {name} = {t['value']}{unit}")
            lines.append(f"      why: {t['why']}")
        for case, m in (r.get("measured") or {}).items():
            lines.append(f"    measured {case}: {m['speedup']}x by the fix ({m['source']})")
        lines.append("")
    return "\n".join(lines) + ("\n" if lines else "")
