#!/usr/bin/env bash
# lean precision variants (bench.numerics.compare), 40 and 100 frames, then 100 frames on a second random model
set -u
T0=$(date +%s); out=$1; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
for s in 0 1; do M=/tmp/model-0.6b-s$s
  [ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --seed $s --out $M > /dev/null 2>&1; done
run() { local s=$(date +%s); timeout $3 python3 .probe/variants.py $1 $2 $out/$4 > $out/$4.log 2>&1; echo "$4 exit $? in $(( $(date +%s) - s )) s"; tail -1 $out/$4.log; }
run /tmp/model-0.6b-s0 40 150 var40
run /tmp/model-0.6b-s0 100 250 var100
left=$(( 590 - ($(date +%s) - T0) )); echo "left $left"
run /tmp/model-0.6b-s1 100 $left var100s1
