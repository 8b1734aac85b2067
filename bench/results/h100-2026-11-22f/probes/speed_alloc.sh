#!/usr/bin/env bash
# bench/speed.py, graphs and compile at k=15 and 5, under one allocator (arg 2: native | cudaMallocAsync);
# with arg 3 "before", also graphs with morph/lean.py as it was before the fp32 attention scores: the run used
# .probe/lean_before.py = `git show 1c08353:morph/lean.py`, placed there (untracked) before the call.
set -u
out=$1; alloc=$2; mkdir -p "$out"
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-speed
M=/tmp/model-0.6b
[ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1
if [ "$alloc" = native ]; then unset PYTORCH_CUDA_ALLOC_CONF; else export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; fi
s=$(date +%s)
timeout ${CAP:-330} python3 -m bench.speed --model $M --device cuda --dtype bf16 --prompts xvector \
  --stacks graphs:15,graphs:5,compile:15,compile:5 --agreement "" --json "$out/speed_$alloc.json" > "$out/speed_$alloc.log" 2>&1
echo "speed $alloc exit $? in $(( $(date +%s) - s )) s"; tail -6 "$out/speed_$alloc.log"
if [ "${3:-}" = before ]; then
  rm -rf /tmp/before && mkdir /tmp/before && cp -r bench morph postprocess /tmp/before/ && cp .probe/lean_before.py /tmp/before/morph/lean.py
  s=$(date +%s)
  (cd /tmp/before && PYTHONPATH=/tmp/gpu-site:/tmp/before timeout 120 python3 -m bench.speed --model $M --device cuda \
     --dtype bf16 --prompts xvector --stacks graphs:15,graphs:5 --agreement "" --json "$out/speed_graphs_before_fix_$alloc.json" \
     > "$out/speed_graphs_before_fix_$alloc.log" 2>&1)
  echo "before-fix graphs exit $? in $(( $(date +%s) - s )) s"; tail -8 "$out/speed_graphs_before_fix_$alloc.log"
fi
