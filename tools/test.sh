#!/usr/bin/env bash
# The test command: run the whole suite under transformers 4.57.3 (what qwen-tts pins), then again under the newest
# 5.x on the registry but for the tests that start Ray clusters: their subject (workers killed, batches handed out,
# files kept) does not change with the transformers release, the engine inside each worker is the one the rest of
# the suite checks under both, and they are a third of a pass's time (CI's 30 minutes hold two full passes no more).
#   bash tools/test.sh            what CI runs (.ci/run)
#   bash tools/test.sh --quick    a quick subset while working: transformers 4.57.3 only, without the tests that
#                                 start Ray clusters (tests/morph/distributed, tests/bench/test_scale.py)
# One environment serves both: torch with its CUDA libraries is about 5.7 GB, and a CI machine's disk
# has run out holding two copies of it. The second pass upgrades transformers in place, as a ComfyUI
# user's `pip install -U transformers` would; pip keeps no cache of the downloads for the same reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_NO_CACHE_DIR=1
venv=.venv-test
releases=(4.57.3 newest)
ray_tests=(--ignore=tests/morph/distributed --ignore=tests/bench/test_scale.py)
subset=()
case "${1:-}" in
  "") ;;
  --quick) releases=(4.57.3); subset=("${ray_tests[@]}") ;;
  *) echo "usage: bash tools/test.sh [--quick]" >&2; exit 2 ;;
esac
status=0
# CI has no GPU: say how old the evidence for tests/gpu is (those tests are listed as skipped below)
python3 tools/gpu_check_age.py
for tf in "${releases[@]}"; do
  echo "=== transformers $tf ($venv)"
  bash tools/setup_env.sh "$venv" "$tf"
  if [ "$tf" = 4.57.3 ]; then
    echo "=== ruff (pyproject.toml [tool.ruff])"
    "$venv/bin/ruff" check . || status=1
  fi
  if [ "$tf" = newest ]; then subset=("${ray_tests[@]}"); fi
  "$venv/bin/python" -m pytest -q -rs ${subset[@]+"${subset[@]}"} || status=1
done
exit $status
