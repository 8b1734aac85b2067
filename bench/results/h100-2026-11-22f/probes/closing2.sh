#!/usr/bin/env bash
# gpu_check at the fixed commit, then (in what is left of the call) bench.speed compile under cudaMallocAsync. arg: OUTDIR
out=$1; start=$(date +%s); mkdir -p $out/speed
bash tools/gpu_check.sh $out/gpu 2>&1 | grep -A30 '"backends"' | grep -v "^\s*\"tests" | head -30
left=$(( 580 - ($(date +%s) - start) ))
echo "speed cap $left s"
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-speed PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
M=/tmp/model-0.6b
[ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1
timeout $left python3 -m bench.speed --model $M --device cuda --dtype bf16 --prompts xvector --stacks compile:15,compile:5 \
  --agreement "" --json $out/speed/speed_compile_cudaMallocAsync.json > /dev/null 2>$out/speed_err.log; echo "speed exit $?"
python3 -c "
import json; r=json.load(open('$out/speed/speed_compile_cudaMallocAsync.json'))
for s in r['results']: print('   ', s['stack'], 'decode', s['ms_per_frame'], 'e2e', s['end_to_end_ms_per_frame'], 'compile_s', s['capture_or_compile_s'])"
