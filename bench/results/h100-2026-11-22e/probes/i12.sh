#!/usr/bin/env bash
# Issue 12: bench/numerics.py with the lean step of this commit (one GEMM per projection) and with the
# old one (.probe/old_lean.py: one fused q/k/v GEMM, one gate/up GEMM), 40 and 100 frames; a GEMM probe;
# then compile (this commit) at 40 frames in the time left. arg: OUTDIR
set -u
T0=$(date +%s); out=$1; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PROJECT_COMMIT=$(cat .whl/COMMIT)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-num
M=/tmp/model-0.6b
[ -f $M/config.json ] || python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out $M > /dev/null 2>&1
python3 .probe/gemm_probe.py $out/gemm_probe.json > /dev/null 2>&1; echo "gemm probe exit $?"
num() { # tag frames stacks cap [old]
  local s=$(date +%s) cmd=(python3 -m bench.numerics)
  [ "${5:-}" = old ] && cmd=(python3 .probe/old_lean.py bench.numerics)
  timeout $4 "${cmd[@]}" --model $M --device cuda --dtype bf16 --frames $2 --stacks $3 \
    --json $out/$1.json --markdown $out/$1.md > $out/$1.log 2>&1
  echo "$1 exit $? in $(( $(date +%s) - s )) s"; grep -E "^Gate" $out/$1.log | tail -1
}
num new40 40 upstream,lean,graphs,fused 150
num old40 40 upstream,lean,graphs 120 old
num new100 100 upstream,lean,graphs,fused 200
num old100 100 upstream,lean,graphs 200 old
left=$(( 585 - ($(date +%s) - T0) )); echo "left $left s"
[ $left -gt 120 ] && num compile40 40 upstream,compile $left
