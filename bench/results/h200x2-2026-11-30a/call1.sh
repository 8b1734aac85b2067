#!/usr/bin/env bash
# Call 1 (two H200s): GPU 0 the server (1.7B CustomVoice) at this commit, then the same with FIRST_CHUNK = 2 (the
# commit before), the first streamed audio (clone1) and the 1.7B's load to first audio (fresh, filled); GPU 1 tests/gpu
# parts A and B under both allocators.
out=${1:?OUTDIR}
mkdir -p "$out/g0" "$out/g1"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu-site .whl/gpu/*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/serve-site .whl/serve/*.whl
(
  export CUDA_VISIBLE_DEVICES=0
  PYTHONPATH=/tmp/gpu-site python3 -m bench.random_model --size 1.7b --variant custom_voice --dtype bfloat16 \
    --out /tmp/models/model-1.7b > /dev/null
  S="VARIANT=custom_voice SIZES=1.7b RATES=1,10,20 WINDOWS=2 DURATION=10 BATCH=64 DEADLINE_S=200 MODELS=/tmp/models"
  env $S bash tools/serve_gpu.sh "$out/g0/serve" > /dev/null 2>&1
  rm -rf /tmp/v2 && mkdir /tmp/v2 && cp -r . /tmp/v2/ 2>/dev/null
  sed -i 's/^FIRST_CHUNK = 1$/FIRST_CHUNK = 2/' /tmp/v2/morph/codec/calls.py && grep -n "^FIRST_CHUNK" /tmp/v2/morph/codec/calls.py
  (cd /tmp/v2 && env $S bash tools/serve_gpu.sh "$out/g0/serve-first2" > /dev/null 2>&1)
  bash tools/batch_gpu.sh "$out/g0/clone1" clone1 > "$out/g0/clone1.txt" 2>&1
  SIZE=1.7b bash tools/ready_gpu.sh "$out/g0/ready17" fresh filled > "$out/g0/ready17.txt" 2>&1
) > "$out/g0/log.txt" 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  LIMIT=420 bash tools/gpu_check_parts.sh "$out/g1" A B
) > "$out/g1/log.txt" 2>&1 &
wait
tar -czf "$out/call1.tgz" -C "$out" g0 g1 && rm -rf "$out/g0" "$out/g1"
