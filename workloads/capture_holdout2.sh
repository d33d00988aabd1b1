#!/usr/bin/env bash
# The second hold-out set on a GPU machine, packed into ONE tarball OUTDIR/holdout2.tar.gz:
# Kineto traces of every model of the set (holdout_models.py) and Nsight Systems SQLite
# exports of NSYS_MODELS (nsys on PATH: `source .device/nsys-env.sh` first).
#   bash workloads/capture_holdout2.sh OUTDIR
# The third set: MODELS="gpt2_compile_train swin_infer opt_generate_b16 efficientnet_train_cl
#   deberta_infer_fp16" NSYS_MODELS="opt_generate_b16" TARBALL=holdout3.tar.gz bash ... OUTDIR
# HOLDOUT_ARGS (e.g. "--steps 1 --warmup 2") is passed to every holdout_models.py run.
set -u
dest=${1:?usage: capture_holdout2.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
models=${MODELS:-"bert_train_fp32 mixtral_moe llama_generate resnet50_train qwen2_prefill mobilenet_b8"}
nsys_models=${NSYS_MODELS:-"llama_generate mixtral_moe resnet50_train"}
tarball=${TARBALL:-holdout2.tar.gz}
kineto_s=${KINETO_TIMEOUT_S:-300}
extra=${HOLDOUT_ARGS:-}
work=$(mktemp -d)
mkdir -p "$dest"
export PYTHONUNBUFFERED=1
trap 'tar -C "$work" -czf "$dest/$tarball" --exclude="*.nsys-rep" . ; ls -la "$work"' EXIT
timeout -k 10 "$kineto_s" "$py" "$here/holdout_models.py" $models $extra --out "$work" 2>&1 | grep -v "^STAGE:\|USDT" | tail -20
for m in $nsys_models; do
  timeout -k 10 120 nsys profile -t cuda,nvtx -s none --capture-range=cudaProfilerApi --force-overwrite true \
    -o "$work/holdout_$m" "$py" "$here/holdout_models.py" "$m" --nsys $extra --out "$work/nsys_rows" 2>&1 | tail -3
  nsys export --type sqlite --force-overwrite true -o "$work/holdout_$m.sqlite" "$work/holdout_$m.nsys-rep" >/dev/null 2>&1 \
    && gzip -9 "$work/holdout_$m.sqlite" || echo "export failed: $m"
done
