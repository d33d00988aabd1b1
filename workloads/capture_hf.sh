#!/usr/bin/env bash
# Capture one group of hf_models.py scenarios on a GPU machine and pack it all into ONE tarball,
# OUTDIR/hf_GROUP.tar.gz (the lent machine hands back a few files only):
#   bash workloads/capture_hf.sh GROUP OUTDIR       # GROUP: A, B, or scenario names joined by commas
# Needs nsys on PATH (on the lent H200: `source .device/nsys-env.sh` first).
#
# Three processes per group, so that nsys's start-up and export are paid once, not per scenario:
#   1. timing    every scenario, no profiler: OUT/timings.jsonl (the before/after step times)
#   2. nsys      one `nsys profile --capture-range=cudaProfilerApi --capture-range-end=repeat`
#                run: one report per scenario's window, exported to SQLite and named after the
#                "hf_scenario NAME" NVTX range each holds (hf_models.py --label-nsys)
#   3. kineto    every scenario under torch.profiler: hf_NAME.kineto.json.gz
# HF_NSYS=each runs one nsys process per scenario instead (slower; if repeat mode misbehaves).
# Each step has a time limit (HF_T_TIME, HF_T_NSYS, HF_T_KINETO seconds) so that the group ends
# within the machine's 10 minutes and the tarball is always written.
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
log() { echo "[$((SECONDS - start)) s] $*"; }

pack() {
  ls -la "$work" >"$work/files.txt"
  tar -C "$work" -czf "$dest/hf_$tag.tar.gz" --exclude=nsys_raw .
  log "packed $(du -h "$dest/hf_$tag.tar.gz" | cut -f1) into $dest/hf_$tag.tar.gz"
}
trap pack EXIT

log "timing $scen"
timeout -k 20 "${HF_T_TIME:-110}" "$py" "$here/hf_models.py" $scen --time --out "$work" >"$work/time.log" 2>&1 \
  || { echo "timing: exit $?"; tail -5 "$work/time.log"; }

log "nsys $scen"
if [ "${HF_NSYS:-repeat}" = each ]; then
  for s in $("$py" "$here/hf_models.py" $scen --list | cut -f1); do
    timeout -s INT -k 30 "${HF_T_NSYS:-240}" nsys profile -t cuda,nvtx -s none --cpuctxsw=none \
        --capture-range=cudaProfilerApi --capture-range-end=stop -o "$work/nsys_raw/$s" -f true \
        "$py" "$here/hf_models.py" "$s" --profiler nsys --out "$work" >>"$work/nsys.log" 2>&1 \
      || echo "nsys $s: exit $?"
  done
else
  timeout -s INT -k 30 "${HF_T_NSYS:-230}" nsys profile -t cuda,nvtx -s none --cpuctxsw=none \
      --capture-range=cudaProfilerApi --capture-range-end=repeat -o "$work/nsys_raw/hf_$tag" -f true \
      "$py" "$here/hf_models.py" $scen --profiler nsys --out "$work" >"$work/nsys.log" 2>&1 \
    || { echo "nsys: exit $?"; tail -5 "$work/nsys.log"; }
fi
ls -la "$work/nsys_raw" >>"$work/nsys.log"
for rep in "$work"/nsys_raw/*.nsys-rep; do
  [ -f "$rep" ] || continue
  nsys export --type sqlite -f true -o "${rep%.nsys-rep}.sqlite" "$rep" >>"$work/nsys_export.log" 2>&1 \
    || echo "export failed: $rep"
done
"$py" "$here/hf_models.py" --label-nsys "$work/nsys_raw" --out "$work" >>"$work/nsys_export.log" 2>&1 \
  || { echo "labelling the nsys exports: some failed"; tail -5 "$work/nsys_export.log"; }

log "kineto $scen"
timeout -k 20 "${HF_T_KINETO:-110}" "$py" "$here/hf_models.py" $scen --profiler kineto --out "$work" \
    >"$work/kineto.log" 2>&1 || { echo "kineto: exit $?"; tail -5 "$work/kineto.log"; }

log "done"
ls -la "$work" | grep -v "^total"
cat "$work/timings.jsonl" 2>/dev/null
