#!/usr/bin/env bash
# Build a Python environment that runs the pack outside ComfyUI (the CLI, the Python API): torch and the pack's
# runtime needs, nothing more. The test extras are tools/test.sh's, the server's and Ray's the pack's extras
# (pip install '.[serve]', '.[ray]').
#   bash tools/setup_env.sh [--cpu] [VENV] [TRANSFORMERS]
# --cpu installs PyTorch's CPU-only torch (from its own index: PyPI's Linux wheels bring CUDA's libraries). VENV
# defaults to .venv; TRANSFORMERS is a version (4.57.3), "newest" (the newest 5.x), or empty to keep whatever the
# install resolves. The order mirrors a ComfyUI user's machine: torch first, then their transformers, then the
# README's install steps.
set -euo pipefail
cd "$(dirname "$0")/.."
cpu=
if [ "${1:-}" = --cpu ]; then cpu=1; shift; fi
venv=${1:-.venv}
tf=${2:-}
python=${PYTHON:-python3}
cpu_index=https://download.pytorch.org/whl/cpu

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip="$venv/bin/python -m pip --disable-pip-version-check -q"
# A torch already in VENV (a CPU-only build, say) is kept, as a ComfyUI user's is; the pack needs no
# torchaudio. Otherwise the tested pair, pinned together: the registry's torchaudio wheels only import
# against their own torch build (the tests cover qwen-tts without a working torchaudio in a subprocess).
if ! $venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "$cpu" ]; then
    # pip alone answers an unreachable index with "No matching distribution found": say the ways round it
    if ! $pip install torch==2.11.0 --index-url "$cpu_index"; then
      echo "setup_env.sh --cpu: could not install torch 2.11.0 from PyTorch's CPU index ($cpu_index; pip's error is" \
           "above). If this machine cannot reach it, install a CPU torch into $venv yourself (from a mirror of that" \
           "index, or a wheel file copied here: $venv/bin/python -m pip install FILE.whl), then run this script" \
           "again: it keeps a torch that is there. Or leave out --cpu: PyPI's torch runs on the CPU too, with CUDA's" \
           "libraries (about 3.3 GB more)." >&2
      exit 1
    fi
  else
    $pip install torch==2.11.0 torchaudio==2.11.0
  fi
fi
case "$tf" in
  "") ;;
  newest) $pip install "transformers>=5,<6" ;;
  *) $pip install "transformers==$tf" ;;
esac
# The README's install steps, exactly as a user runs them.
$pip install -r requirements.txt
$venv/bin/python install.py >/dev/null
$venv/bin/python - <<'PY'
import torch, transformers
print(f"environment ready: torch {torch.__version__}, transformers {transformers.__version__}")
PY
