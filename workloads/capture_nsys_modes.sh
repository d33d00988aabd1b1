#!/usr/bin/env bash
# Capture the traces that exercise nsys recording modes the planted scenarios do not: CUDA
# graph replays in the default --cuda-graph-trace=graph mode (one row per replay, kernels
# untraced) and in node mode (every kernel), and two processes in one session (overlapping
# correlation and stream ids). Report + SQLite export per capture, into DIR.
#   bash workloads/capture_nsys_modes.sh [DIR]
# Needs nsys on PATH (on the lent H200: `source .device/nsys-env.sh` first).
set -u
out=${1:-out/nsys_modes}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
common=(-t cuda,nvtx -s none --cpuctxsw=none -f true)
for mode in graph node; do
  echo "== graphs, --cuda-graph-trace=$mode"
  nsys profile "${common[@]}" --cuda-graph-trace=$mode --capture-range=cudaProfilerApi \
      --capture-range-end=stop -o "$out/graphs_$mode" \
      python3 "$here/planted.py" graphs --profiler nsys >"$out/graphs_$mode.log" 2>&1 \
    || { echo "nsys failed"; tail -5 "$out/graphs_$mode.log"; }
done
echo "== two_procs (whole processes)"
nsys profile "${common[@]}" -o "$out/two_procs" \
    python3 "$here/planted.py" two_procs --profiler none >"$out/two_procs.log" 2>&1 \
  || { echo "nsys failed"; tail -5 "$out/two_procs.log"; }
for rep in "$out"/*.nsys-rep; do
  nsys export --type sqlite -f true -o "${rep%.nsys-rep}.sqlite" "$rep" >>"$out/export.log" 2>&1 \
    || echo "export failed for $rep"
done
ls -la "$out"
