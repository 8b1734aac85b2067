#!/usr/bin/env bash
# The test command: run the whole suite under transformers 4.57.3 (what qwen-tts pins), then again under the newest
# 5.x on the registry for the tests whose subject goes through transformers: the engine, the nodes and the CLI. The
# second pass leaves out the Ray clusters (tests/morph/distributed, tests/bench/test_scale.py), the bench harness
# (tests/bench), the repository's tools (tests/tools), the pip install (tests/test_install.py), the HTTP server
# (tests/morph/serve, tests/test_cli_serve.py) and the README's rules and examples (tests/test_readme.py): what they
# check (workers killed, files kept, reports summed, layout, routes and replies, the README's commands) does not
# change with the transformers release, the engine inside them is the one the second pass checks (the server's,
# tests/morph/test_live_engine.py, included), and CI's 30 minutes no longer hold two whole passes.
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
not_transformers=("${ray_tests[@]}" --ignore=tests/bench --ignore=tests/tools --ignore=tests/test_install.py
                  --ignore=tests/morph/serve --ignore=tests/test_cli_serve.py --ignore=tests/test_readme.py)
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
  if [ "$tf" = newest ]; then subset=("${not_transformers[@]}"); fi
  "$venv/bin/python" -m pytest -q -rs ${subset[@]+"${subset[@]}"} || status=1
done
exit $status
