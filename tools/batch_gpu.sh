#!/usr/bin/env bash
# Issue 23's batch figures on one GPU (bench/batch.py), static beside continuous in the same call:
#   bash tools/gpu_check.sh                 # here: fill .whl/gpu (the same wheels)
#   bash tools/batch_gpu.sh OUTDIR          # on the GPU machine (carry .whl/gpu): random 0.6B and 1.7B dims, bf16,
#                                           # default mode, k=5, two repeats each, ComfyUI's allocator
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash tools/batch_gpu.sh OUTDIR}
mkdir -p "$out"
[ -d /tmp/gpu-site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu-site \
  .whl/gpu/*.whl || exit 1
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PROJECT_COMMIT=$(cat .whl/gpu/COMMIT 2>/dev/null)
run() { name=$1; shift; echo "=== $name: $*"; python3 -m bench.batch --device cuda --dtype bf16 --seq-groups 5 --repeats 2 \
  --json "$out/$name.json" "$@" 2> "$out/$name.log" | tail -n 0; grep -h '^{' "$out/$name.log" | cut -c1-400; }
run uniform32 --batching continuous,static --size 0.6b --lines 32 --batch-sizes 32
run uniform128 --batching continuous,static --size 0.6b --lines 128 --batch-sizes 128
run script256 --batching continuous,static --size 0.6b --lines 256 --lengths script --batch-sizes 16,64
run icl32-1.7b --size 1.7b --lines 32 --batch-sizes 32 --prompts icl --batching continuous
