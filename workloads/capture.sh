#!/usr/bin/env bash
# Capture the planted-symptom traces on a GPU machine: one Nsight Systems report (+ its
# SQLite export) and one Kineto trace per scenario, into DIR (default out/traces).
#   bash workloads/capture.sh [DIR] [SCENARIO...]
# Needs nsys on PATH (on the lent H200: `source .device/nsys-env.sh` first) and the nvtx
# Python package (carried as a wheel there).
set -u
out=${1:-out/traces}; shift || true
scenarios=${*:-tail skinny tiny_stream small_gemms huge_grid balanced mixed}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for s in $scenarios; do
  extra=""
  [ "$s" = small_gemms ] && extra="--emit-nvtx"
  echo "== $s: nsys"
  nsys profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi \
      --capture-range-end=stop -o "$out/$s" -f true \
      python3 "$here/planted.py" "$s" --profiler nsys $extra >"$out/$s.nsys.log" 2>&1 \
    || { echo "nsys failed for $s"; tail -5 "$out/$s.nsys.log"; }
  if [ -f "$out/$s.nsys-rep" ]; then
    nsys export --type sqlite -f true -o "$out/$s.sqlite" "$out/$s.nsys-rep" >>"$out/$s.nsys.log" 2>&1 \
      || echo "export failed for $s"
  fi
  echo "== $s: kineto"
  python3 "$here/planted.py" "$s" --profiler kineto --out "$out" >"$out/$s.kineto.log" 2>&1 \
    || { echo "kineto failed for $s"; tail -5 "$out/$s.kineto.log"; }
done
ls -la "$out"
