#!/usr/bin/env bash
# Issue 23's batch figures on one GPU (bench/batch.py), on the continuous batch (what every mode but eager renders
# on), the batch peer beside them, and after each render the script job of the same lines (files, manifest, SRT,
# dialogue):
#   bash tools/gpu_check.sh                           # here: fill .whl/gpu (the same wheels)
#   bash tools/fetch_device_wheels.sh .whl/peers peers  # here, for the peer (faster-qwen3-tts-batch)
#   bash tools/batch_gpu.sh OUTDIR [RUN...]           # on the GPU machine (carry .whl): random 0.6B and 1.7B dims,
#                                                     # bf16, default mode, k=5, two repeats each, ComfyUI's allocator;
#                                                     # OUTDIR.tgz holds every run's JSON and log
# RUN names which of the runs below to make (default: issue 23's; `issue35` names the continuous batch's targets:
# the skewed script, a lone row, a single 20 s line, the script at 64 and the card caps, and a warm clone of one
# frame; several calls: name a few runs in each; `script64`: the script at 64 alone, no script job; `memory-map`:
# where the continuous batch's memory goes at 64).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash tools/batch_gpu.sh OUTDIR [RUN...]}
shift
wanted=" ${*:-uniform32 peer32 uniform128 script256 icl32-1.7b memory-1.7b} "
wanted=${wanted/ issue35 / uniform32 uniform128 script256 skewed256 lone64 lone1 line20s clone1 cards-0.6b cards-1.7b }
mkdir -p "$out"
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
[ -d /tmp/gpu-site ] || $PIP /tmp/gpu-site .whl/gpu/*.whl || exit 1
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PROJECT_COMMIT=$(cat .whl/gpu/COMMIT 2>/dev/null)
model() {  # one random checkpoint per size, shared by the pack and the peer
  [ -d "/tmp/model-$1" ] || python3 -m bench.random_model --size "$1" --dtype bfloat16 --out "/tmp/model-$1" > /dev/null
  echo "/tmp/model-$1"
}
run() { name=$1; size=$2; shift 2; [[ $wanted == *" $name "* ]] || return 0
  echo "=== $name ($size): $*"; began=$(date +%s)
  python3 -m bench.batch --model "$(model "$size")" --device cuda --dtype bf16 --seq-groups 5 --repeats 2 \
    --json "$out/$name.json" "$@" > /dev/null 2> "$out/$name.log"
  echo "exit $? after $(( $(date +%s) - began )) s"; grep -h '^{' "$out/$name.log" | cut -c1-400; }
run uniform32 0.6b --lines 32 --batch-sizes 32
if [[ $wanted == *" peer32 "* ]]; then
  # faster-qwen3-tts-batch on the same checkpoint and 32 lines, in a folder of its own (qwen-tts-hf installs the
  # import name qwen_tts); under the native allocator: it crashed under cudaMallocAsync
  # (bench/results/h100-2026-11-22d/NOTES.md)
  [ -d /tmp/peers ] || $PIP /tmp/peers .whl/peers/*.whl || exit 1
  echo "=== peer32"
  PYTHONPATH=/tmp/peers:$PYTHONPATH PYTORCH_CUDA_ALLOC_CONF= python3 -m bench.batch_faster --model "$(model 0.6b)" \
    --lines 32 --frames 62 --batch-size 32 --json "$out/peer32.json" > "$out/peer32.log" 2>&1
  echo "exit $?"; grep -h '^{' "$out/peer32.log" | cut -c1-400
fi
run uniform128 0.6b --lines 128 --batch-sizes 128
run script256 0.6b --lines 256 --lengths script --batch-sizes 16,64
run script64 0.6b --lines 256 --lengths script --batch-sizes 64 --no-script-job
run icl32-1.7b 1.7b --lines 32 --batch-sizes 32 --prompts icl
# what morph/memory.py declares against the peak at the 1.7B dims (tests/gpu/test_memory.py runs the 0.6B ones)
run memory-1.7b 1.7b --lines 64 --batch-sizes 1,8,32,64 --no-script-job
# issue 35: a minute-long line in every 64 among 1-5 s ones; the minute-long line among 63 short ones, and alone; one
# 20 s line (250 frames) end to end
run skewed256 0.6b --lines 256 --lengths skewed --batch-sizes 64
run lone64 0.6b --lines 64 --lengths skewed --batch-sizes 64 --no-script-job
run lone1 0.6b --lines 1 --lengths skewed --batch-sizes 1 --no-script-job
run line20s 0.6b --lines 1 --frames 250 --batch-sizes 1 --no-script-job
# issue 35: a warm clone of one frame, the floor of first audio (bench.stream --frames 1: streamed and whole, 16 lines
# each, the first call apart, then the host time of the engine's parts), at both sizes
if [[ $wanted == *" clone1 "* ]]; then
  for size in 0.6b 1.7b; do
    echo "=== clone1-$size"; began=$(date +%s)
    python3 -m bench.stream --model "$(model "$size")" --device cuda --dtype bf16 --lines 16 --frames 1 --parts \
      --json "$out/clone1-$size.json" > /dev/null 2> "$out/clone1-$size.log"
    echo "exit $? after $(( $(date +%s) - began )) s"
  done
fi
cards() { size=$1; [[ $wanted == *" cards-$size "* ]] || return 0
  echo "=== cards-$size"; began=$(date +%s)
  python3 -m bench.cards --model "$(model "$size")" --device cuda --dtype bf16 --cards 8,12,16,24 \
    --batch-sizes 64,32,16,8 --json "$out/cards-$size.json" > /dev/null 2> "$out/cards-$size.log"
  echo "exit $? after $(( $(date +%s) - began )) s"; }
cards 0.6b
cards 1.7b
# where the continuous batch's memory goes on the script at 64, block by block (bench.memory_map: torch records its
# memory history under the native allocator only)
if [[ $wanted == *" memory-map "* ]]; then
  echo "=== memory-map"; began=$(date +%s)
  PYTORCH_CUDA_ALLOC_CONF= python3 -m bench.memory_map --model "$(model 0.6b)" --device cuda --dtype bf16 \
    --lines 256 --lengths script --batch-size 64 --json "$out/memory-map.json" > /dev/null 2> "$out/memory-map.log"
  echo "exit $? after $(( $(date +%s) - began )) s"
fi
# a device call brings back at most 8 files: every run's JSON and log in one
tar czf "$out.tgz" -C "$out" . && echo "all of $out in $out.tgz"
