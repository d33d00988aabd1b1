"""Pictures for the report: which SMs work in each wave, and before/after bars.

Optional: needs matplotlib (the `plot` extra). Every function returns the written path, or
None when matplotlib is missing, so callers can say so instead of failing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def _save(fig, path: Path) -> None:
    """PNG bytes rendered in memory, then written without following a planted symlink."""
    import io

    from ..safeio import write_file

    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, buf.getvalue())


def wave_grid(tiles: int, sms: int) -> list[list[bool]]:
    """Rows = waves, columns = SMs: True where an SM runs a tile in that wave (SM-saturation
    model: tile t runs on SM t % sms in wave t // sms)."""
    waves = max(1, math.ceil(tiles / sms))
    return [[w * sms + s < tiles for s in range(sms)] for w in range(waves)]


def wave_occupancy(findings: Sequence[Any], path: Path, max_kernels: int = 4) -> Path | None:
    """One strip per finding with a tile count: SMs across, waves down; idle cells show the
    tail (or the under-filled grid)."""
    plt = _plt()
    if plt is None:
        return None
    items = [f for f in findings if f.evidence.get("tiles") and f.evidence.get("sm_count")][:max_kernels]
    if not items:
        return None
    fig, axes = plt.subplots(len(items), 1, figsize=(10, 1.2 + 0.9 * len(items)), squeeze=False)
    for ax, f in zip(axes[:, 0], items):
        tiles, sms = int(f.evidence["tiles"]), int(f.evidence["sm_count"])
        grid = wave_grid(tiles, sms)
        ax.imshow([[1.0 if c else 0.0 for c in row] for row in grid], aspect="auto", cmap="Blues", vmin=-0.2, vmax=1.0, interpolation="nearest")
        ax.set_yticks(range(len(grid)))
        ax.set_yticklabels([f"wave {w + 1}" for w in range(len(grid))], fontsize=7)
        ax.set_xlabel(f"SM (0..{sms - 1})", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
        shape = f.shape
        what = f"{shape['M']}x{shape['N']}x{shape['K']}" if shape else str(f.kernel)[:40]
        busy = tiles / (len(grid) * sms)
        ax.set_title(f"{f.symptom}: {what}: {tiles} tiles on {sms} SMs, SMs busy {busy:.0%} of the waves", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def before_after(rows: Sequence[dict], path: Path) -> Path | None:
    """Bars of median time per provider, one group per shape (rows: shape, provider,
    median_us, status)."""
    plt = _plt()
    if plt is None:
        return None
    ok = [r for r in rows if r.get("status") == "ok" and r.get("median_us")]
    if not ok:
        return None
    shapes = list(dict.fromkeys(r["shape"] for r in ok))
    providers = list(dict.fromkeys(r["provider"] for r in ok))
    best: dict[tuple[str, str], float] = {}
    for r in ok:
        key = (r["shape"], r["provider"])
        best[key] = min(best.get(key, math.inf), float(r["median_us"]))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(shapes) * max(1, len(providers)) / 3), 3.2))
    width = 0.8 / max(1, len(providers))
    for i, p in enumerate(providers):
        xs = [j + i * width for j in range(len(shapes))]
        ys = [best.get((s, p), 0.0) for s in shapes]
        ax.bar(xs, ys, width=width, label=p)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))])
    ax.set_xticklabels(shapes, fontsize=7)
    ax.set_ylabel("median time (us), lower is better", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path
