#!/usr/bin/env bash
# The test command: run the whole suite under both supported transformers releases,
#   4.57.3 (what qwen-tts pins) and the newest 5.x on the registry.
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
subset=()
case "${1:-}" in
  "") ;;
  --quick) releases=(4.57.3); subset=(--ignore=tests/morph/distributed --ignore=tests/bench/test_scale.py) ;;
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
  "$venv/bin/python" -m pytest -q -rs ${subset[@]+"${subset[@]}"} || status=1
done
exit $status
