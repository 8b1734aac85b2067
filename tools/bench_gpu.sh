#!/usr/bin/env bash
# What users wait for, measured in one GPU device call (under 9.5 minutes on one H100), peers beside the pack:
#
#   bash tools/bench_gpu.sh            # here, with network: fill .whl/bench with the pack's wheels (sections pack,
#                                      # tools of tools/device_wheels/common.txt), .whl/bench/peers with the peers' (section
#                                      # peers), and record the commit and the changed files there
#   bash tools/bench_gpu.sh OUTDIR     # on the GPU machine (no network), carrying .whl/bench: writes
#                                      # OUTDIR/bench_gpu.json (every part, bench/gpu_report.py) and OUTDIR/bench_gpu.log
#
# On the GPU machine it installs the wheels offline (the peers into a folder of their own: qwen-tts-hf installs
# the import name qwen_tts, as qwen-tts does), builds random 0.6B bf16 weights that both stacks load, then runs,
# each step bounded by what is left of DEADLINE_S (default 540 s from the start):
#   speed        bench/speed.py: one 250-frame line, batch 1, x-vector voice, upstream qwen-tts and every mode of
#                MODES (default "auto graphs") at seq_groups 15 and 5, end to end and decode only in turn, twice each
#                (upstream's four runs of about 50 s fit the step without the kernel count, `bench.speed --profile`,
#                about 60 s: run it in a call of its own; tools/evidence_gpu.sh makes three runs of each)
#   batch        bench/batch.py: 32 lines of 62 frames (about 5 s), batch 32, the same modes, k=15 and 5
#   faster       bench/speed_faster.py: faster-qwen3-tts 0.5.4 on the same line
#   faster_batch bench/batch_faster.py: faster-qwen3-tts-batch 0.2.0 on the same 32 lines, batch 32
#   first_call   bench/speed.py --first-call: per mode of FIRST_CALL_MODES (default "auto"), a fresh process with
#                empty Triton/Inductor caches, then one reusing them: load and first line, each timed
# A step that fails or runs out of time is recorded as such; the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_steps.sh
if ! command -v nvidia-smi >/dev/null 2>&1; then
  bash tools/fetch_device_wheels.sh .whl/bench pack tools || exit 1
  bash tools/fetch_device_wheels.sh .whl/bench/peers peers || exit 1
  record_tree .whl/bench
  fits_call .whl/bench || exit 1
  echo "ready; on the GPU machine run: bash tools/bench_gpu.sh \$OUT (carry .whl/bench)"
  exit 0
fi

out=${1:?usage: bash tools/bench_gpu.sh OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/bench_gpu.log") 2>&1
tee_pid=$!
deadline=$(( $(date +%s) + ${DEADLINE_S:-540} ))
parts=$(mktemp -d)
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
$PIP --target /tmp/site .whl/bench/*.whl || exit 1
$PIP --target /tmp/peers .whl/bench/peers/*.whl || exit 1
PROJECT_COMMIT=$(cat .whl/bench/COMMIT 2>/dev/null || true)
PROJECT_CHANGES=$(cat .whl/bench/CHANGES 2>/dev/null || true)
export PROJECT_COMMIT PROJECT_CHANGES PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MAIN=/tmp/site:$PWD
PEERS=/tmp/peers:/tmp/site:$PWD  # the peers' qwen_tts first
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$parts/gpu.txt"

status_dir=$parts

MODEL=/tmp/model-0.6b
step build 150 20 env PYTHONPATH="$MAIN" python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out "$MODEL"
read -r -a modes <<< "${MODES:-auto graphs}"
stacks=upstream
for mode in "${modes[@]}"; do stacks+=",$mode:15,$mode:5"; done
modes_csv=$(IFS=,; echo "${modes[*]}")
step speed 300 20 env PYTHONPATH="$MAIN" python3 -m bench.speed --model "$MODEL" --device cuda --dtype bf16 --prompts xvector \
  --stacks "$stacks" --repeats 2 --agreement "" --json "$parts/speed.json"
step batch 120 20 env PYTHONPATH="$MAIN" python3 -m bench.batch --model "$MODEL" --device cuda --dtype bf16 --lines 32 --frames 62 \
  --batch-sizes 32 --seq-groups 15,5 --modes "$modes_csv" --prompts xvector --json "$parts/batch.json"
step faster 100 20 env PYTHONPATH="$PEERS" python3 -m bench.speed_faster --model "$MODEL" --prompts xvector --repeats 2 --profile \
  --json "$parts/faster.json"
step faster_batch 100 20 env PYTHONPATH="$PEERS" python3 -m bench.batch_faster --model "$MODEL" --lines 32 --frames 62 --batch-size 32 \
  --json "$parts/faster_batch.json"
read -r -a first_modes <<< "${FIRST_CALL_MODES:-auto}"
# each fresh process gets an equal share of the time left, so a slow cold compile still leaves the warm row
per_process=$(( (deadline - $(date +%s) - 15) / (2 * ${#first_modes[@]}) ))
step first_call 600 20 env PYTHONPATH="$MAIN" python3 -m bench.speed --first-call "$(IFS=,; echo "${first_modes[*]}")" --model "$MODEL" \
  --device cuda --dtype bf16 --prompts xvector --first-call-timeout "$(( per_process > 20 ? per_process : 20 ))" \
  --json "$parts/first_call.json"
python3 -m bench.gpu_report "$parts" "$out/bench_gpu.json"
status=$?
exec >&- 2>&-  # let tee write the log's last lines before the device collects OUTDIR
wait "$tee_pid"
exit $status
