#!/usr/bin/env bash
# A script over several GPUs against one (bench/scale.py), in one device call on a multi-GPU kind (nvidia-h200-x2):
#
#   bash tools/scale_gpu.sh                    # here, with network: fill .whl/scale with the pack's wheels (sections
#                                              # pack but PyAV, tools) and Ray's (section ray: Ray 2.60 without the parts the
#                                              # pack never imports, so that it fits a device call), record the commit
#   bash tools/scale_gpu.sh OUTDIR [OPTION...] # on the GPU machine (no network), carrying .whl/scale: install them
#                                              # offline, build random 0.6B bf16 weights, run bench/scale.py with the
#                                              # OPTIONs (default: every GPU, and bench/scale.py's defaults: 20,480
#                                              # lines, 2,048 on one GPU, batch 64, 1 repeat, about 430 s on two
#                                              # H200s; repeat the call) and write OUTDIR/scale.json and scale.log;
#                                              # both sides with the same CPU threads (--threads, default 1, what
#                                              # Ray gives a worker), recorded in scale.json
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1; then
  bash tools/fetch_device_wheels.sh .whl/scale pack tools ray || exit 1
  # PyAV (35 MiB) is the speech server's alone (morph/serve/): a script's render never imports it, and with it the
  # call would carry more than 64 MiB
  rm -f .whl/scale/av-*.whl
  git rev-parse HEAD > .whl/scale/COMMIT
  git status --porcelain --untracked-files=no | cut -c4- > .whl/scale/CHANGES
  tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  total=$(( tracked + $(du -sb .whl/scale | cut -f1) ))
  echo "travels: $(( total / 1048576 )) MiB of 64 (repository, .whl/scale)"
  [ "$total" -lt $(( 64 * 1048576 )) ] || { echo "over the 64 MiB a device call carries" >&2; exit 1; }
  echo "ready; on the GPU machine run: bash tools/scale_gpu.sh \$OUT (carry .whl/scale)"
  exit 0
fi

out=${1:?usage: bash tools/scale_gpu.sh OUTDIR [bench/scale.py options]}
shift
mkdir -p "$out"
exec > >(tee "$out/scale.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/scale-site \
  .whl/scale/*.whl || exit 1
# Ray's workers inherit this environment, so they import the same packages.
export PYTHONPATH=/tmp/scale-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
PROJECT_COMMIT=$(cat .whl/scale/COMMIT 2>/dev/null || true)
PROJECT_CHANGES=$(cat .whl/scale/CHANGES 2>/dev/null || true)
export PROJECT_COMMIT PROJECT_CHANGES
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
gpus=$(nvidia-smi --list-gpus | wc -l)
# a folder of its own per call: a warm machine keeps the last call's /tmp, and the builder refuses a full folder
model=$(mktemp -d)/model-0.6b
python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out "$model" || exit 1
[ $# -gt 0 ] || set -- --gpus "$gpus"  # bench/scale.py's defaults for the rest
python3 -m bench.scale --model "$model" --device cuda --dtype bf16 --json "$out/scale.json" "$@"
