"""The pack against a real ComfyUI's services (ModelPatcher, load_models_gpu, unload_all_models, ProgressBar,
interrupt): runs only when COMFYUI_PATH points at a ComfyUI checkout (CI has none).

    COMFYUI_PATH=/path/to/ComfyUI [COMFYUI_PYTHON=/path/to/its/python] pytest tests/nodes/test_real_comfy.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

COMFYUI = os.environ.get("COMFYUI_PATH")


@pytest.mark.skipif(not COMFYUI, reason="set COMFYUI_PATH to a ComfyUI checkout to run against real ComfyUI")
def test_against_real_comfyui_services(model_dirs):
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    result = subprocess.run(
        [python, str(ROOT / "tests" / "nodes" / "real_comfy_check.py"), "--comfyui", COMFYUI,
         "--model", str(model_dirs("tiny", "base"))],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ok"] is True
