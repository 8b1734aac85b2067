#!/usr/bin/env bash
# Issue 80's speed comparison in one GPU device call of at most DEADLINE_S (default 420 s): the pack beside upstream
# qwen-tts and the faster-qwen3-tts peers, on the same random 0.6B weights (bench/random_model.py), bf16, sdpa,
# x-vector voice:
#
#   bash tools/compare_gpu.sh          # here, with network: fill .whl/compare with the pack's wheels (sections pack,
#                                      # tools of tools/device_wheels/common.txt) and .whl/compare/peers with the
#                                      # peers' (section peers), record the commit, check the call's 64 MiB
#   bash tools/compare_gpu.sh OUT      # on the GPU machine (no network), carrying .whl/compare
#
# On the GPU machine every part runs under the native allocator (faster-qwen3-tts-batch crashed under cudaMallocAsync,
# bench/results/h100-2026-11-22c and -22d; the pack's one-line figures moved under 1% between the two, -22d), each
# step bounded by what is left of DEADLINE_S from the start; they run build, peers, batch, line (upstream's slow line
# last, so a short call still compares the peers):
#   build  bench/random_model.py: the checkpoint every part loads (32-37 s on an H100 machine)
#   line   bench/speed.py: one 250-frame line, batch 1: the pack (mode auto, seq_groups 15 and 5, its first call
#          apart: --warm-up), then upstream qwen-tts 0.1.1 (its first run is its first call: it captures nothing);
#          end to end and decode only in turn, 2 runs each; upstream's runs took about 50 s each on an H100
#          (bench/results/h100-2026-11-25), so about 230 s
#   batch  bench/batch.py: 32 lines of 62 frames (about 5 s), batch 32, mode auto, seq_groups 15 and 5: decode only,
#          then end to end after a first render apart (--warm-up), 2 runs each (four such configurations took 31 s,
#          h100-2026-11-22d)
#   peers  bench/batch_faster.py --line-json, one process, one load: faster-qwen3-tts 0.5.4 on the line (its first
#          call apart, 2 runs each way), then faster-qwen3-tts-batch 0.2.0 on the 32 lines (a first batch of the same
#          62 frames apart, 2 runs each way); what is left, about 120 s (in two processes, the line with kernel
#          counts and the batch with one run each way, they took 74 s and 55 s on an H100, h100-2026-11-22d)
# and then bench/compare.py. OUT gets line.json, batch.json, faster.json and faster_batch.json (each bench's report),
# compare.json (every figure's min, median and max over its runs, how each step ended, and for a part that did not
# finish the phase it was in and its stack at the time limit) and compare.log: six files of the eight a call returns.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_steps.sh
wheels=.whl/compare
if ! command -v nvidia-smi >/dev/null 2>&1; then
  bash tools/fetch_device_wheels.sh "$wheels" pack tools || exit 1
  bash tools/fetch_device_wheels.sh "$wheels/peers" peers || exit 1
  record_tree "$wheels"
  # over 64 MiB: move bench/results out of the tree for the call (none of these steps reads it; docs/development.md)
  fits_call "$wheels" || exit 1
  echo "ready; on the GPU machine run: bash tools/compare_gpu.sh \$OUT (carry $wheels)"
  exit 0
fi

out=${1:?usage: bash tools/compare_gpu.sh OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/compare.log") 2>&1
tee_pid=$!
deadline=$(( $(date +%s) + ${DEADLINE_S:-420} ))
status_dir=$(mktemp -d)
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target"
$PIP /tmp/compare-site "$wheels"/*.whl || exit 1
$PIP /tmp/compare-peers "$wheels"/peers/*.whl || exit 1
PROJECT_COMMIT=$(cat "$wheels/COMMIT" 2>/dev/null || true)
PROJECT_CHANGES=$(cat "$wheels/CHANGES" 2>/dev/null || true)
export PROJECT_COMMIT PROJECT_CHANGES PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
unset PYTORCH_CUDA_ALLOC_CONF
MAIN=/tmp/compare-site:$PWD
PEERS=/tmp/compare-peers:/tmp/compare-site:$PWD  # the peers' qwen_tts (qwen-tts-hf) before qwen-tts's
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$status_dir/gpu.txt"

# a folder of its own per call: a warm machine keeps the last call's /tmp, and the builder refuses a full folder
model=$(mktemp -d)/model-0.6b
step build 120 60 env PYTHONPATH="$MAIN" python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out "$model"
# the peers first, then the pack's lines, upstream's slow line last: a short call still compares the peers
step peers 300 60 env PYTHONPATH="$PEERS" python3 -m bench.batch_faster --model "$model" --lines 32 --frames 62 \
  --batch-size 32 --warm-frames 62 --repeats 2 --json "$out/faster_batch.json" --line-json "$out/faster.json" \
  --line-frames 250
step batch 80 30 env PYTHONPATH="$MAIN" python3 -m bench.batch --model "$model" --device cuda --dtype bf16 \
  --lines 32 --frames 62 --prompts xvector --batch-sizes 32 --seq-groups 15,5 --modes auto --repeats 2 --warm-up \
  --no-script-job --json "$out/batch.json"
step line 300 60 env PYTHONPATH="$MAIN" python3 -m bench.speed --model "$model" --device cuda --dtype bf16 \
  --prompts xvector --frames 250 --stacks auto:15,auto:5,upstream --repeats 2 --warm-up --agreement "" \
  --json "$out/line.json"
env PYTHONPATH="$MAIN" python3 -m bench.compare "$out" "$status_dir"
status=$?
rm -rf "$status_dir" "$(dirname "$model")"
exec >&- 2>&-  # let tee write the log's last lines before the device collects OUT
wait "$tee_pid"
exit $status
