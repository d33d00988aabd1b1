"""How well does advisor/codegen/schedule_model.py rank configs? Checked against measured rows.

    python3 bench/model_check.py [--csv bench/results/h200.csv.gz] [--runs RUN_ID,...] [-v]

The loop and bench_gemm.py time a strategy's candidates in the order the model predicts, and
the loop's time budget may end before the last ones run. So the model's job is to order
them. For each (shape, strategy) measured in the chosen runs (default: the latest run with
tail or skinny rows), this compares the model's prediction with each config's measured
median (the fastest of its rows). It prints Kendall's tau between the two orders, and
whether the measured best config is among the model's first three. A summary line closes
the output. No GPU needed: it reads the committed CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.codegen import schedule_model
from advisor.run.bench.rows import open_text

SUITES = ("tail", "skinny", "balanced")
DEFAULT_CSV = Path(__file__).resolve().parent / "results" / "h200.csv.gz"


def latest_run(rows: list[dict]) -> str:
    runs = [r["run_id"] for r in rows if r.get("suite") in ("tail", "skinny") and r.get("run_id")]
    if not runs:
        raise ValueError("no tail or skinny rows in the CSV")
    return max(runs)


def kendall_tau(pairs: list[tuple[float, float]]) -> float:
    """Kendall's tau-a between the first and second members (ties count as neither)."""
    conc = disc = 0
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            s = (pairs[i][0] - pairs[j][0]) * (pairs[i][1] - pairs[j][1])
            conc += s > 0
            disc += s < 0
    return (conc - disc) / max(1, conc + disc)


def check(rows: list[dict], runs: set[str], dev: schedule_model.Device | None = None) -> list[dict]:
    """One result per (shape, strategy) with at least three measured configs."""
    dev = dev or schedule_model.Device()
    measured: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if (r.get("run_id") not in runs or r.get("status") != "ok" or r.get("suite") not in SUITES
                or not str(r.get("config", "")).startswith("{") or r.get("provider") == "torch.matmul"):
            continue
        key = (r["shape"], r["provider"], r.get("dtype", "bf16"))
        t = float(r["median_us"])
        measured[key][r["config"]] = min(t, measured[key].get(r["config"], t))
    out = []
    for (shape, strategy, dtype), cfgs in sorted(measured.items()):
        if len(cfgs) < 3:
            continue
        M, N, K = (int(x) for x in shape.split("x"))
        elt = 4 if dtype == "fp32" else 2
        items = [(us, schedule_model.predict(strategy, json.loads(c), M, N, K, elt, dev).predicted_us, c)
                 for c, us in cfgs.items()]
        best = min(items)
        top3 = sorted(items, key=lambda x: x[1])[:3]
        out.append({"shape": shape, "strategy": strategy, "dtype": dtype, "configs": len(items),
                    "tau": kendall_tau([(a, b) for a, b, _ in items]), "best_in_top3": best in top3,
                    "best_us": best[0], "model_first_us": top3[0][0]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--runs", default=None, help="comma list of run ids (default: the latest tail/skinny run)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per (shape, strategy)")
    args = ap.parse_args(argv)
    with open_text(args.csv) as f:
        rows = list(csv.DictReader(f))
    runs = set(args.runs.split(",")) if args.runs else {latest_run(rows)}
    results = check(rows, runs)
    if not results:
        print(f"no (shape, strategy) with three or more measured configs in runs {sorted(runs)}")
        return 1
    for r in results if args.verbose else []:
        print(f"{r['shape']:>16} {r['strategy']:>20} {r['configs']:3d} configs  tau {r['tau']:+.2f}  "
              f"best {r['best_us']:8.1f} us {'in' if r['best_in_top3'] else 'NOT in'} the model's top 3 "
              f"(model's first: {r['model_first_us']:.1f} us)")
    hits = sum(r["best_in_top3"] for r in results)
    tau = sum(r["tau"] for r in results) / len(results)
    print(f"runs {','.join(sorted(runs))}: best config in the model's top 3 for {hits}/{len(results)} "
          f"(shape, strategy) pairs; mean Kendall tau {tau:+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
