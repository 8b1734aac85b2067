#!/usr/bin/env bash
# Issue 12 after the fix: numerics at 100 frames, every stack + the old lean as variants; then graphs speed, new vs old
set -u
T0=$(date +%s); out=$1; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-i12
M=/tmp/model-0.6b
[ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1
s=$(date +%s); timeout 420 python3 .probe/final_numerics.py $M 100 $out/numerics100 > $out/numerics100.log 2>&1
echo "numerics100 exit $? in $(( $(date +%s) - s )) s"; tail -1 $out/numerics100.log
sp() { local s=$(date +%s); timeout $1 "${@:3}" --model $M --device cuda --dtype bf16 --prompts xvector \
  --stacks graphs:15,graphs:5 --agreement "" --json $out/$2.json > $out/$2.log 2>&1; echo "$2 exit $? in $(( $(date +%s) - s )) s"; }
left=$(( 590 - ($(date +%s) - T0) )); echo "left $left"
sp $(( left / 2 )) speed_graphs_new python3 -m bench.speed
left=$(( 590 - ($(date +%s) - T0) ))
sp $left speed_graphs_old python3 .probe/old350.py bench.speed
python3 - $out <<'PY'
import json, sys
for n in ("new", "old"):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/speed_graphs_{n}.log") if l.startswith("{")]
        print(n, [(r["stack"], r["ms_per_frame"], r["end_to_end_ms_per_frame"]) for r in rows])
    except Exception as e: print(n, e)
PY
