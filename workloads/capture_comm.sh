#!/usr/bin/env bash
# Capture per-rank traces of the tensor-parallel MLP block (workloads/planted_comm.py), plain and
# overlapped, on N GPUs: one Nsight Systems report (+ SQLite export) per rank and schedule, and
# one Kineto trace per rank and schedule, into DIR (default out/comm_traces).
#   bash workloads/capture_comm.sh [DIR] [N] [TxHxF] [planted_comm.py options, e.g. --graph]
# Needs nsys on PATH (on the lent H200s: `source .device/nsys-env.sh` first). NVLink multicast
# stays off (also set here, so that every process nsys starts inherits it).
set -u
out=${1:-out/comm_traces}; n=${2:-2}; shape=${3:-8192x4096x4096}; shift 3 2>/dev/null || shift $#
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for s in plain overlap; do
  echo "== $s: nsys, one report per rank"
  # a run that hangs (e.g. at exit) must not hold the machine: its reports are written by then
  timeout 120 torchrun --nproc-per-node "$n" --no-python \
    nsys profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=node --capture-range=cudaProfilerApi \
      --capture-range-end=stop -o "$out/${s}_rank%q{RANK}" -f true \
      python3 "$here/planted_comm.py" "$s" --shape "$shape" --profiler nsys "$@" >"$out/$s.nsys.log" 2>&1 \
    || { echo "nsys failed for $s"; tail -5 "$out/$s.nsys.log"; }
  for rep in "$out/${s}"_rank*.nsys-rep; do
    [ -f "$rep" ] || continue
    nsys export --type sqlite -f true -o "${rep%.nsys-rep}.sqlite" "$rep" >>"$out/$s.nsys.log" 2>&1 \
      || echo "export failed for $rep"
  done
  echo "== $s: kineto, one trace per rank"
  timeout 120 torchrun --nproc-per-node "$n" "$here/planted_comm.py" "$s" --shape "$shape" --profiler kineto \
      --out "$out" "$@" >"$out/$s.kineto.log" 2>&1 \
    || { echo "kineto failed for $s"; tail -5 "$out/$s.kineto.log"; }
  tail -1 "$out/$s.kineto.log"
done
ls -la "$out"
