#!/usr/bin/env bash
# Lease 1: VRAM decomposition (in-process ComfyUI, cudaMallocAsync), then speed graphs+compile native & async. arg: OUTDIR
out=$1; mkdir -p $out
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=/tmp/model-0.6b
s=$(date +%s); python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1; echo "model built in $(( $(date +%s) - s )) s"
for m in plain auto eager; do
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout 200 python3 .probe/vram_cycles.py $M $m > $out/vram_$m.log 2>&1
  echo "vram $m exit $?"; tail -1 $out/vram_$m.log | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); [print(' ',k,json.dumps(v)) for k,v in r.items()]" 2>/dev/null || tail -5 $out/vram_$m.log
done
