"""Nsight Compute counters that explain a measured result (`--counters`).

Time says which schedule won; counters say why. For one shape, `collect` profiles one call
of each provider (torch.matmul, our data-parallel baseline, each strategy's best verified
config) under `ncu`, one child process per provider (`python -m advisor.run.bench.ncu_target`),
and reduces the per-kernel counters to one line per provider:

    tensor pipe active   % of the SMs' active cycles the tensor pipe worked (wgmma on Hopper,
                         mma.sync elsewhere): the math side of TMA/math overlap
    SM busy              SM active cycles / elapsed cycles: idle SMs (a tail wave, too few
                         CTAs) show here, not in the tensor pipe number
    achieved occupancy   active warps / the SM's maximum, next to the theoretical limit
    waves per SM         of the longest kernel, as Nsight Compute computes them
    DRAM throughput      % of peak, and DRAM bytes over the compulsory bytes (A, B read once,
                         C written once): > 1 means operands were re-read from HBM
    L2 throughput        % of peak, and the L2 hit rate: near peak with DRAM not means the
                         schedule re-reads a small operand from L2 (every column tile
                         streaming the same A rows), which only sharing loads (cluster
                         multicast) or wider tiles relieve

Clocks are left as they are (`--clock-control none`: the device notes say not to lock them),
caches are flushed between replay passes (ncu's default), so the counter durations are of a
cold-L2 call and can differ from the timed medians, which are the numbers to rank by.

Only the standard library is used here; the child process does the GPU work.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..errors import AdvisorError
from ..executables import find_executable

STANDARD_LOCATIONS = (
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/opt/nvidia/nsight-compute/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)
PROFILE_TIMEOUT_S = 300.0  # one provider: interpreter start, cached compile, ~20 replay passes

# key -> ncu metric. A metric the device's ncu does not know is dropped (query first, retry
# on "Failed to find"). ncu 2025.3 on the H200 counts Hopper's wgmma under the hmma pipe and
# has no gmma metric (seen 2026-11-29); the gmma name is kept for versions that split them.
METRICS: dict[str, str] = {
    "time_ns": "gpu__time_duration.sum",
    "tensor_gmma_pct": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_hmma_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_active_cycles": "sm__cycles_active.avg",
    "sm_elapsed_cycles": "sm__cycles_elapsed.avg",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    # L2: a schedule can be bound there without DRAM being busy, when every program re-reads
    # the same small operand (a 128-row A tile read by each of 128 column tiles)
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "registers": "launch__registers_per_thread",
}
KEY_OF = {v: k for k, v in METRICS.items()}


class CountersUnavailable(AdvisorError):
    """ncu is missing or cannot read counters here; the run goes on without them."""


# --------------------------------------------------------------------------------------------
# Finding ncu and the metrics it knows
# --------------------------------------------------------------------------------------------


def find_ncu() -> str | None:
    """Path of the ncu executable: `$NCU` (must be valid when set), PATH, standard installs."""
    return find_executable("ncu", "NCU", STANDARD_LOCATIONS, CountersUnavailable)


def not_found_note() -> str:
    return ("Nsight Compute (ncu) not found on PATH, in $NCU or in " + ", ".join(STANDARD_LOCATIONS)
            + ": no counters collected (install Nsight Compute or set NCU=/path/to/ncu)")


_METRIC_NAME = re.compile(r"^\s*([a-z][a-z0-9]*__[a-z0-9_]+)\b", re.M)


def known_metric_bases(query_output: str) -> set[str]:
    """Base metric names in `ncu --query-metrics` output (one per line, then a description)."""
    return set(_METRIC_NAME.findall(query_output))


def usable_metrics(wanted: Iterable[str], bases: set[str]) -> list[str]:
    """The wanted metrics whose base the device's ncu lists. launch__* attributes are not
    hardware counters and are not always listed: keep them. An empty query keeps all."""
    wanted = list(wanted)
    if len(bases) < 20:  # the query failed or printed something else: let the retry decide
        return wanted
    return [m for m in wanted if m.startswith("launch__") or m.split(".", 1)[0] in bases]


def unknown_metrics(stderr_text: str, requested: Iterable[str]) -> list[str]:
    """Requested metrics that ncu said it could not find."""
    bad = []
    for m in requested:
        base = m.split(".", 1)[0]
        for line in stderr_text.splitlines():
            if "failed to find metric" in line.lower() and (m in line or base in line):
                bad.append(m)
                break
    return bad


# --------------------------------------------------------------------------------------------
# Parsing ncu's raw CSV page
# --------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"^-?[0-9][0-9,]*(\.[0-9]+)?([eE][-+]?[0-9]+)?$")


def _number(text: str) -> float | None:
    t = text.strip()
    if not t or not _NUMBER.match(t):
        return None
    return float(t.replace(",", ""))


def parse_raw_csv(text: str) -> list[dict]:
    """Rows of `ncu --import R --csv --page raw --print-units base`: one dict per kernel with
    `id`, `kernel`, `grid`, `block` and `metrics` {ncu metric name: (value, unit)}. Lines
    before the header (ncu's ==PROF== / ==WARNING== chatter) are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') or ln.startswith("ID,")), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    units = [""] * len(header)
    if body and body[0] and body[0][0].strip() == "":  # the units row
        units, body = body[0] + [""] * (len(header) - len(body[0])), body[1:]
    col = {name: i for i, name in enumerate(header)}
    out = []
    for r in body:
        if len(r) < len(header):
            continue
        metrics = {}
        for name, i in col.items():
            if "__" not in name:
                continue
            v = _number(r[i])
            if v is not None:
                metrics[name] = (v, units[i])
        out.append({
            "id": r[col["ID"]] if "ID" in col else "",
            "kernel": r[col["Kernel Name"]] if "Kernel Name" in col else "",
            "grid": r[col["Grid Size"]] if "Grid Size" in col else "",
            "block": r[col["Block Size"]] if "Block Size" in col else "",
            "metrics": metrics,
        })
    return out


# --------------------------------------------------------------------------------------------
# One line per provider
# --------------------------------------------------------------------------------------------


def _weighted(kernels: list[dict], key: str) -> float | None:
    """Time-weighted mean of a per-kernel percentage over the kernels that have it."""
    num = den = 0.0
    for k in kernels:
        t, v = k["values"].get("time_ns"), k["values"].get(key)
        if t is None or v is None:
            continue
        num, den = num + t * v, den + t
    return num / den if den else None


def summarize(provider: str, kernels: list[dict], *, compulsory_bytes: float | None = None) -> dict:
    """Reduce one provider's profiled kernels (parse_raw_csv rows) to the report's line."""
    ks = [dict(k, values={KEY_OF.get(n, n): v for n, (v, _u) in k["metrics"].items()}) for k in kernels]
    for k in ks:
        v = k["values"]
        tensor = [x for x in (v.get("tensor_gmma_pct"), v.get("tensor_hmma_pct")) if x is not None]
        if tensor:
            v["tensor_pct"] = max(tensor)
        if v.get("sm_active_cycles") is not None and v.get("sm_elapsed_cycles"):
            v["sm_busy_pct"] = 100.0 * v["sm_active_cycles"] / v["sm_elapsed_cycles"]
    times = [k["values"].get("time_ns") for k in ks]
    total = sum(t for t in times if t is not None) if any(t is not None for t in times) else None
    main = max(ks, key=lambda k: k["values"].get("time_ns") or 0.0) if ks else None
    dram = [k["values"].get("dram_read_bytes", 0.0) + k["values"].get("dram_write_bytes", 0.0) for k in ks
            if "dram_read_bytes" in k["values"] or "dram_write_bytes" in k["values"]]
    dram_bytes = sum(dram) if dram else None
    mv = main["values"] if main else {}
    return {
        "provider": provider,
        "kernels": len(ks),
        "main_kernel": main["kernel"] if main else None,
        "grid": main["grid"] if main else None,
        "time_us": total / 1e3 if total is not None else None,
        "tensor_pct": _weighted(ks, "tensor_pct"),
        "sm_busy_pct": _weighted(ks, "sm_busy_pct"),
        "sm_throughput_pct": _weighted(ks, "sm_throughput_pct"),
        "achieved_occupancy_pct": _weighted(ks, "achieved_occupancy_pct"),
        "theoretical_occupancy_pct": mv.get("theoretical_occupancy_pct"),
        "waves_per_sm": mv.get("waves_per_sm"),
        "registers": mv.get("registers"),
        "dram_pct": _weighted(ks, "dram_pct"),
        "dram_bytes": dram_bytes,
        "dram_x_compulsory": (dram_bytes / compulsory_bytes) if dram_bytes and compulsory_bytes else None,
        "l2_pct": _weighted(ks, "l2_pct"),
        "l2_hit_pct": _weighted(ks, "l2_hit_pct"),
    }


def explain(s: dict) -> str:
    """One reading of a provider's counters, from fixed thresholds (a hint, not a verdict)."""
    notes = []
    busy, tensor, dram, l2 = s.get("sm_busy_pct"), s.get("tensor_pct"), s.get("dram_pct"), s.get("l2_pct")
    if busy is not None and busy < 85:
        notes.append(f"SMs idle {100 - busy:.0f}% of the time (partial wave or too few CTAs)")
    if dram is not None and dram >= 70:
        notes.append("memory-bound (DRAM near peak)")
    elif l2 is not None and l2 >= 70:
        notes.append("L2-bound (L2 near peak, DRAM not: operands re-read from L2)")
    if tensor is not None and tensor >= 85:  # cuBLAS kept it 93% busy on the H200's big GEMMs
        notes.append("tensor pipe busy")
    elif tensor is not None and (dram is None or dram < 70) and (l2 is None or l2 < 70):  # nothing saturated
        notes.append("tensor pipe under-fed (latency: pipeline depth, TMA/math overlap, occupancy)")
    x = s.get("dram_x_compulsory")
    if x is not None and x > 1.5:
        notes.append(f"{x:.1f}x the compulsory DRAM traffic (operands re-read)")
    if s.get("kernels", 0) > 1:
        notes.append(f"{s['kernels']} kernels a call")
    return "; ".join(notes)


# --------------------------------------------------------------------------------------------
# Running ncu
# --------------------------------------------------------------------------------------------


@dataclass
class CounterResult:
    summaries: list[dict] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)  # long format: one row per kernel and metric
    notes: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)  # .ncu-rep files, open them in the ncu GUI

    def to_dict(self) -> dict:
        return {"summaries": self.summaries, "notes": self.notes, "reports": self.reports}


def _timeout() -> float:
    raw = os.environ.get("ADVISOR_NCU_TIMEOUT")
    try:
        return float(raw) if raw else PROFILE_TIMEOUT_S
    except ValueError:
        raise AdvisorError(f"ADVISOR_NCU_TIMEOUT={raw!r} is not a number of seconds") from None


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "==ERROR==" in line or "ERR_NVGPUCTRPERM" in line:
            return line.strip()[:300]
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return tail[-1][:300] if tail else "no output"


def query_bases(ncu: str) -> set[str]:
    try:
        p = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return known_metric_bases(p.stdout) if p.returncode == 0 else set()


def target_command(M: int, N: int, K: int, dtype: str, provider: str, config: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "advisor.run.bench.ncu_target", "--shape", f"{M}x{N}x{K}", "--dtype", dtype,
           "--provider", provider]
    if config:
        cmd += ["--config", config]
    return cmd


def profile_command(ncu: str, metrics: list[str], report: Path, target: list[str]) -> list[str]:
    return [ncu, "--profile-from-start", "off", "--clock-control", "none", "--target-processes", "all",
            "--metrics", ",".join(metrics), "--export", str(report), "--force-overwrite", *target]


def import_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


def _child_env() -> dict:
    from .bench.isolate import child_env

    return child_env()


def profile_provider(ncu: str, metrics: list[str], report: Path, target: list[str],
                     timeout_s: float) -> tuple[list[dict], list[str], str]:
    """Profile one target; returns (kernels, metrics used, error or ""). Retries without
    metrics this ncu does not know."""
    metrics = list(metrics)
    for _ in range(len(metrics) + 1):
        try:
            p = subprocess.run(profile_command(ncu, metrics, report, target), capture_output=True, text=True,
                               timeout=timeout_s, env=_child_env())
        except subprocess.TimeoutExpired:
            return [], metrics, f"ncu ran past {timeout_s:.0f} s (set ADVISOR_NCU_TIMEOUT to allow more)"
        except OSError as exc:
            return [], metrics, f"could not start ncu: {exc}"
        out = p.stdout + "\n" + p.stderr
        bad = unknown_metrics(out, metrics)
        if bad:
            metrics = [m for m in metrics if m not in bad]
            continue
        if p.returncode != 0 or not report.exists():
            return [], metrics, _first_error(out)
        imp = subprocess.run(import_command(ncu, report), capture_output=True, text=True, timeout=timeout_s)
        kernels = parse_raw_csv(imp.stdout)
        if not kernels:
            return [], metrics, ("no kernel was profiled: " + _first_error(out + "\n" + imp.stdout + imp.stderr))
        return kernels, metrics, ""
    return [], metrics, "ncu knew none of the requested metrics"


def _safe_name(provider: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", provider)[:60] or "provider"


def collect(M: int, N: int, K: int, dtype: str, providers: list[tuple[str, str | None]], out_dir: Path, *,
            element_size: int = 2, log: Callable[[str], None] | None = None,
            run_info: dict | None = None) -> CounterResult:
    """Profile each (provider, config JSON or None) once on this GPU. Never raises for a
    provider that fails: its failure becomes a note and the others go on."""
    res = CounterResult()
    try:
        ncu = find_ncu()
    except CountersUnavailable as exc:  # a bad $NCU must not cost the timings already made
        res.notes.append(str(exc))
        return res
    if ncu is None:
        res.notes.append(not_found_note())
        return res
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = usable_metrics(METRICS.values(), query_bases(ncu))
    timeout_s = _timeout()
    compulsory = float(M * K + K * N + M * N) * element_size
    shape = f"{M}x{N}x{K}"
    for i, (provider, config) in enumerate(providers, 1):
        if log:
            log(f"counters {shape}: ncu on {provider} ({i}/{len(providers)})")
        report = out_dir / f"ncu_{shape}_{i}_{_safe_name(provider)}.ncu-rep"
        started = time.time()
        kernels, metrics, err = profile_provider(ncu, metrics, report, target_command(M, N, K, dtype, provider, config),
                                                 timeout_s)
        if err:
            res.notes.append(f"{provider}: {err}")
            continue
        res.reports.append(report.name)
        s = summarize(provider, kernels, compulsory_bytes=compulsory)
        s["config"] = config or ""
        s["reading"] = explain(s)
        s["profile_s"] = round(time.time() - started, 1)
        res.summaries.append(s)
        for k in kernels:
            for name, (value, unit) in k["metrics"].items():
                if name not in KEY_OF:  # the raw page also lists every device attribute
                    continue
                res.rows.append(dict(run_info or {}, shape=shape, dtype=dtype, provider=provider, config=config or "",
                                     kernel_id=k["id"], kernel=k["kernel"], metric=name, key=KEY_OF.get(name, ""),
                                     value=value, unit=unit))
    return res


def write_rows(path: Path, rows: list[dict]) -> None:
    """Counter rows as CSV (long format), appended with a header when the file is new."""
    if not rows:
        return
    import io

    from ..safeio import read_regular, write_file

    cols = list(dict.fromkeys(k for r in rows for k in r))
    old = (read_regular(path) or b"").decode("utf-8", "replace")
    out = io.StringIO(newline="")
    out.write(old)
    w = csv.DictWriter(out, fieldnames=cols, extrasaction="ignore")
    if not old:
        w.writeheader()
    w.writerows(rows)
    write_file(path, out.getvalue())  # whole file anew: never through a planted symlink


def providers_for(table: list[dict]) -> list[tuple[str, str | None]]:
    """(provider, config) to profile from a ShapeResult.table(): every verified provider's
    best config (baselines first); the trace's observed kernel is not ours to launch."""
    out = []
    for t in table:
        if t["provider"] == "observed in trace" or not t.get("median_us"):
            continue
        cfg = t.get("config") or None
        if cfg and cfg.strip() in ("-", "{}", "null"):
            cfg = None
        out.append((t["provider"], cfg))
    order = {"torch.matmul": 0, "dp": 1}
    return sorted(out, key=lambda pc: order.get(pc[0], 2))


def as_json(res: CounterResult) -> str:
    return json.dumps(res.to_dict(), indent=2, default=str)
