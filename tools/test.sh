#!/usr/bin/env bash
# The test command: build both supported environments and run the whole suite in each.
#   transformers 4.57.3 (what qwen-tts pins) and the newest transformers 5.x on the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for tf in 4.57.3 newest; do
  venv=.venv-test-$tf
  echo "=== transformers $tf ($venv)"
  bash tools/setup_env.sh "$venv" "$tf"
  "$venv/bin/python" -m pytest -q || status=1
done
exit $status
