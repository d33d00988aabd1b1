#!/usr/bin/env bash
# Capture the unplanted model traces (model_step.py: train, decode) on a GPU machine: one
# Nsight Systems report + SQLite export and one Kineto trace per scenario, into DIR.
#   bash workloads/capture_models.sh [DIR] [SCENARIO...]
# Needs nsys on PATH (on the lent H200: `source .device/nsys-env.sh` first).
set -u
out=${1:-out/models}; shift || true
scenarios=${*:-train decode train_compiled}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for s in $scenarios; do
  echo "== $s: nsys"
  nsys profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi \
      --capture-range-end=stop -o "$out/model_$s" -f true \
      python3 "$here/model_step.py" "$s" --profiler nsys >"$out/model_$s.nsys.log" 2>&1 \
    || { echo "nsys failed for $s"; tail -5 "$out/model_$s.nsys.log"; }
  if [ -f "$out/model_$s.nsys-rep" ]; then
    nsys export --type sqlite -f true -o "$out/model_$s.sqlite" "$out/model_$s.nsys-rep" \
        >>"$out/model_$s.nsys.log" 2>&1 || echo "export failed for $s"
  fi
  echo "== $s: kineto"
  python3 "$here/model_step.py" "$s" --profiler kineto --out "$out" >"$out/model_$s.kineto.log" 2>&1 \
    || { echo "kineto failed for $s"; tail -5 "$out/model_$s.kineto.log"; }
done
ls -la "$out"
