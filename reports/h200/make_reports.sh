#!/usr/bin/env bash
# Make the committed diagnose --run reports on the GPU machine, from the planted traces:
#   bash reports/h200/make_reports.sh OUTDIR [BUDGET_S]
# Each scenario gets OUTDIR/<scenario>/: report.md/json (diagnosis), run_report.md/json
# (before/after, graph-timed, verified), rows.csv, counters.csv + ncu/*.ncu-rep (Nsight
# Compute, when ncu is found) and the generated variant. Copy them to reports/h200/ after,
# except the variant_*.py files: put their `advisor generate` command (the knobs are
# run_report.json's variant_knobs) in reports/h200/README.md instead.
set -u
out=${1:?usage: make_reports.sh OUTDIR [BUDGET_S]}
budget=${2:-45}
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
for s in tail skinny balanced; do
  echo "== $s"
  mkdir -p "$out/$s"
  python3 -m advisor.cli diagnose "$here/tests/data/h200/$s.sqlite.gz" --run --counters --budget-s "$budget" \
      --out "$out/$s" >"$out/$s/stdout.md" 2>"$out/$s/stderr.log" || echo "$s: exit $?"
  tail -3 "$out/$s/stderr.log"
done
