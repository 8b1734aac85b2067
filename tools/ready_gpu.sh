#!/usr/bin/env bash
# Issue 79's first-against-second renders on one GPU (bench/ready.py), each run a process of its own: a new machine's
# first line (Triton's cache empty, then filled), the script, 32 and 128 lines of 5 s and the skewed script after
# MorphTTS.ready, and the script without it, in the same call.
#   bash tools/gpu_check.sh                  # here: fill .whl/gpu
#   bash tools/ready_gpu.sh OUTDIR [RUN...]  # on the GPU machine (carry .whl/gpu); OUTDIR/ready.tgz holds the JSONs
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash tools/ready_gpu.sh OUTDIR [RUN...]}
shift
wanted=" ${*:-fresh filled script64 noready64 uniform32 uniform128 skewed256 line20s} "
mkdir -p "$out/runs"
[ -d /tmp/gpu-site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target \
  /tmp/gpu-site .whl/gpu/*.whl || exit 1
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=${ALLOC:-backend:cudaMallocAsync} PROJECT_COMMIT=$(cat .whl/gpu/COMMIT 2>/dev/null)
size=${SIZE:-0.6b}
[ -d "/tmp/model-$size" ] || python3 -m bench.random_model --size "$size" --dtype bfloat16 --out "/tmp/model-$size" \
  > /dev/null
run() { name=$1; shift; [[ $wanted == *" $name "* ]] || return 0
  echo "=== $name: $*"; began=$(date +%s)
  python3 -m bench.ready --model "/tmp/model-$size" --device cuda --dtype bf16 --json "$out/runs/$name.json" "$@" \
    > /dev/null 2> "$out/runs/$name.log"
  echo "exit $? after $(( $(date +%s) - began )) s"; python3 - "$out/runs/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("load_s", "ready_s", "held_gib", "first_over_second", "from_load_to_first_audio_s")},
      [(x["wall_s"], x["captures"], x.get("taken_peak_gib")) for x in r["renders"]])
PY
}
rm -rf /tmp/triton-new && mkdir -p /tmp/triton-new
run fresh --lines 1 --frames 62 --width 1 --triton-cache /tmp/triton-new
run filled --lines 1 --frames 62 --width 1 --triton-cache /tmp/triton-new
run script64 --lines 256 --lengths script --width 64
run noready64 --lines 256 --lengths script --width 64 --no-ready
run uniform32 --lines 32 --width 32 --ready-width 64
run uniform128 --lines 128 --width 128
run skewed256 --lines 256 --lengths skewed --width 64
run line20s --lines 1 --frames 250 --width 1 --ready-width 64
tar -czf "$out/ready.tgz" -C "$out" runs && rm -rf "$out/runs"
