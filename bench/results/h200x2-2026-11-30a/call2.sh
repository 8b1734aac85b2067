#!/usr/bin/env bash
# Call 2 (two H200s): part C, the card table's ten renders a row, under cudaMallocAsync on GPU 0 and native on GPU 1;
# then on GPU 0 the first against second renders of the 0.6B (tools/ready_gpu.sh).
out=${1:?OUTDIR}
mkdir -p "$out/g0" "$out/g1"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu-site .whl/gpu/*.whl
(
  export CUDA_VISIBLE_DEVICES=0
  BACKENDS=cudaMallocAsync TESTS=tests/gpu/test_cards.py timeout 400 bash tools/gpu_check.sh "$out/g0/c"
  bash tools/ready_gpu.sh "$out/g0/ready" fresh filled script64 uniform32 uniform128 skewed256 line20s
) > "$out/g0/log.txt" 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  BACKENDS=native TESTS=tests/gpu/test_cards.py timeout 400 bash tools/gpu_check.sh "$out/g1/c"
) > "$out/g1/log.txt" 2>&1 &
wait
tar -czf "$out/call2.tgz" -C "$out" g0 g1 && rm -rf "$out/g0" "$out/g1"
