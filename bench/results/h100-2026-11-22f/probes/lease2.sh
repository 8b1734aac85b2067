#!/usr/bin/env bash
# Compile-mode options vs reproducibility: each variant in a fresh process with an empty Inductor cache. arg: OUTDIR
out=$1; mkdir -p $out
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
M=/tmp/model-0.6b
[ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1
for spec in default:1:140 default:2:140 cdt:1:190; do
  IFS=: read v i cap <<< "$spec"
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$v-$i; rm -rf $TORCHINDUCTOR_CACHE_DIR
  s=$(date +%s)
  COMPILE_VARIANT=$v timeout $cap python3 .probe/speed_variant.py --model $M --device cuda --dtype bf16 --prompts xvector \
    --stacks compile:15,compile:5 --agreement "" --json $out/speed_${v}_$i.json > $out/speed_${v}_$i.log 2>&1
  echo "$v run $i exit $? in $(( $(date +%s) - s )) s"
  python3 -c "
import json; r=json.load(open('$out/speed_${v}_$i.json'))
for s in r['results']: print('   ', s['stack'], 'decode', s['ms_per_frame'], 'e2e', s['end_to_end_ms_per_frame'], 'compile_s', s['capture_or_compile_s'], 'ran', s['ran_as'])" 2>/dev/null
done
