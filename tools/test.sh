#!/usr/bin/env bash
# The test command: run the whole suite under transformers 4.57.3 (what qwen-tts pins), then again under the newest
# 5.x on the registry for the tests whose subject goes through transformers: loading and the compat shims
# (tests/morph/qwen), upstream's own layers and generate (exactness, the static batches, the predictor's logits, the
# prefill and lean layers against upstream's forward, the codec against upstream's decoder), the engine's contract
# end to end (the golden codes, the Python API, the server's engine), the nodes and the CLI. What the rest checks
# (kernels, pages and scheduling, files, the Ray clusters, the HTTP server, the bench harness, the layout, the pip
# install, the README's rules) runs the pack's own code on what those load, the same under either release.
#   bash tools/test.sh            what CI runs (.ci/run)
#   bash tools/test.sh --quick    a quick subset while working: transformers 4.57.3 only, without the tests that
#                                 start Ray clusters
# One environment serves both: torch with its CUDA libraries is about 5.7 GB, and a CI machine's disk
# has run out holding two copies of it. The second pass upgrades transformers in place, as a ComfyUI
# user's `pip install -U transformers` would; pip keeps no cache of the downloads for the same reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_NO_CACHE_DIR=1
venv=.venv-test
releases=(4.57.3 newest)
ray_tests=(--ignore=tests/morph/distributed --ignore=tests/bench/test_scale.py)
through_transformers=(tests/morph/qwen tests/morph/test_exactness.py tests/morph/test_render.py
                      tests/morph/decode/test_predictor_logits.py tests/morph/decode/test_prefill.py
                      tests/morph/decode/test_lean.py tests/morph/reference/test_patch.py tests/morph/codec
                      tests/morph/test_golden_codes.py tests/morph/test_api.py tests/morph/engine/test_thread.py
                      tests/nodes tests/test_cli.py tests/test_cli_voice.py)
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
  # the test extras, on top of what a user's set-up installs (requirements-test.txt says what each is for)
  "$venv/bin/python" -m pip --disable-pip-version-check -q install -r requirements-test.txt
  if [ "$tf" = 4.57.3 ]; then
    echo "=== ruff (pyproject.toml [tool.ruff])"
    "$venv/bin/ruff" check . || status=1
  fi
  if [ "$tf" = newest ]; then subset=("${through_transformers[@]}"); fi
  "$venv/bin/python" -m pytest -q -rs ${subset[@]+"${subset[@]}"} || status=1
done
exit $status
