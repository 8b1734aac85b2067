#!/usr/bin/env bash
set -u
T0=$(date +%s); out=$1; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-i12
M=/tmp/model-0.6b
[ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1
s=$(date +%s); timeout 250 python3 .probe/final_numerics.py $M 100 $out/numerics100 upstream,lean,graphs,fused > $out/numerics100.log 2>&1
echo "numerics100 exit $? in $(( $(date +%s) - s )) s"; tail -1 $out/numerics100.log
left=$(( 593 - ($(date +%s) - T0) )); echo "left $left"
s=$(date +%s); timeout $left python3 .probe/final_numerics.py $M 40 $out/numerics40_compile upstream,compile > $out/numerics40_compile.log 2>&1
echo "compile exit $? in $(( $(date +%s) - s )) s"; tail -1 $out/numerics40_compile.log
