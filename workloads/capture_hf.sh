#!/usr/bin/env bash
# Capture one group of hf_models.py scenarios on a GPU machine and pack it all into ONE tarball,
# OUTDIR/hf_GROUP.tar.gz (the lent machine hands back a few files only):
#   bash workloads/capture_hf.sh GROUP OUTDIR    # GROUP: A, B, C, or scenario names joined by commas
# Needs nsys on PATH (on the lent H200: `source .device/nsys-env.sh` first).
#
# Three processes per group, so that nsys's start-up and export are paid once, not per scenario:
#   1. timing    every scenario, no profiler: OUT/timings.jsonl (the before/after step times)
#   2. nsys      one `nsys profile --capture-range=cudaProfilerApi --capture-range-end=repeat`
#                run: one report per scenario's window, exported to SQLite and named after the
#                "hf_scenario NAME" NVTX range each holds (hf_models.py --label-nsys)
#   3. kineto    every scenario under torch.profiler: hf_NAME.kineto.json.gz
# nsys records kernels inside CUDA graphs one by one (--cuda-graph-trace=node: group C replays graphs).
# HF_NSYS=each runs one nsys process per scenario instead (slower; if repeat mode misbehaves).
# Each step has a time limit (HF_T_TIME, HF_T_NSYS, HF_T_KINETO seconds) so that the group ends
# within the machine's 10 minutes and the tarball is always written. HF_ARGS adds arguments to
# every hf_models.py run (a smoke run without a GPU: HF_ARGS="--device cpu --tiny"); HF_KEEP=1
# keeps the scratch folder.
set -u
group=${1:?usage: capture_hf.sh GROUP OUTDIR}
dest=${2:?usage: capture_hf.sh GROUP OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/hf_${group//,/_}.XXXXXX")  # scratch: only the tarball goes to OUTDIR
tag=${group//,/_}
mkdir -p "$dest" "$work/nsys_raw"
dest=$(cd "$dest" && pwd)
export PYTHONUNBUFFERED=1
scen=${group//,/ }
start=$SECONDS
# C compiles in each of its processes (cold in the first, from Inductor's disk cache after): more time
case $group in C) t_time=200 t_nsys=180 t_kineto=150 ;; *) t_time=140 t_nsys=230 t_kineto=120 ;; esac
log() { echo "[$((SECONDS - start)) s] $*"; }

pack() {
  ls -la "$work" >"$work/files.txt"
  tar -C "$work" -czf "$dest/hf_$tag.tar.gz" --exclude=nsys_raw .
  log "packed $(du -h "$dest/hf_$tag.tar.gz" | cut -f1) into $dest/hf_$tag.tar.gz"
  # the lent machine hands back files of 16 MiB at most; a trace over a few MB wants fewer steps
  find "$work" -maxdepth 1 -name '*.gz' -size +4M -printf 'WARNING: %f is %s bytes\n'
  [ "$(stat -c %s "$dest/hf_$tag.tar.gz")" -le 16777216 ] || echo "WARNING: the tarball is over 16 MiB"
  [ -n "${HF_KEEP:-}" ] || rm -rf "$work"
}
trap pack EXIT

log "timing $scen"
timeout -k 20 "${HF_T_TIME:-$t_time}" "$py" "$here/hf_models.py" $scen ${HF_ARGS:-} --time --out "$work" >"$work/time.log" 2>&1 \
  || { echo "timing: exit $?"; tail -5 "$work/time.log"; }

log "nsys $scen"
if [ "${HF_NSYS:-repeat}" = each ]; then
  for s in $("$py" "$here/hf_models.py" $scen --list | cut -f1); do
    timeout -s INT -k 30 "${HF_T_NSYS:-$t_nsys}" nsys profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=node \
        --capture-range=cudaProfilerApi --capture-range-end=stop -o "$work/nsys_raw/$s" -f true \
        "$py" "$here/hf_models.py" "$s" ${HF_ARGS:-} --profiler nsys --out "$work" >>"$work/nsys.log" 2>&1 \
      || echo "nsys $s: exit $?"
  done
else
  timeout -s INT -k 30 "${HF_T_NSYS:-$t_nsys}" nsys profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=node \
      --capture-range=cudaProfilerApi --capture-range-end=repeat -o "$work/nsys_raw/hf_$tag" -f true \
      "$py" "$here/hf_models.py" $scen ${HF_ARGS:-} --profiler nsys --out "$work" >"$work/nsys.log" 2>&1 \
    || { echo "nsys: exit $?"; tail -5 "$work/nsys.log"; }
fi
ls -la "$work/nsys_raw" >>"$work/nsys.log"
# whatever nsys numbered its reports (one per capture range), export each; the labelling reads
# which scenario each holds from its NVTX ranges
for rep in "$work"/nsys_raw/*nsys-rep*; do
  [ -f "$rep" ] || continue
  nsys export --type sqlite -f true -o "$work/nsys_raw/$(basename "$rep" | tr . _).sqlite" "$rep" \
      >>"$work/nsys_export.log" 2>&1 || echo "export failed: $rep"
done
"$py" "$here/hf_models.py" --label-nsys "$work/nsys_raw" --out "$work" >>"$work/nsys_export.log" 2>&1 \
  || { echo "labelling the nsys exports: some failed"; tail -5 "$work/nsys_export.log"; }

log "kineto $scen"
timeout -k 20 "${HF_T_KINETO:-$t_kineto}" "$py" "$here/hf_models.py" $scen ${HF_ARGS:-} --profiler kineto --out "$work" \
    >"$work/kineto.log" 2>&1 || { echo "kineto: exit $?"; tail -5 "$work/kineto.log"; }

log "done"
ls -la "$work" | grep -v "^total"
cat "$work/timings.jsonl" 2>/dev/null
exit 0  # the EXIT trap packs
