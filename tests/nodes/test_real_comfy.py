"""The pack against a real ComfyUI's services (ModelPatcher, load_models_gpu, unload_all_models, ProgressBar,
interrupt): runs only when COMFYUI_PATH points at a ComfyUI checkout (CI has none).

    COMFYUI_PATH=/path/to/ComfyUI [COMFYUI_PYTHON=/path/to/its/python] pytest tests/nodes/test_real_comfy.py

COMFYUI_FRONT_END_ROOT=<unpacked comfyui-frontend-package>/static serves another frontend build (the
recorded sizes are frontend 1.58.1's: ComfyUI 0.33.0 pins 1.49.6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from . import workflow_tools as wt
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


def _frontend_tools(python: str) -> str | None:
    """Why the real-frontend check cannot run here, or None."""
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        return f"no Chromium at {chromium} (apt-get install chromium, or set CHROMIUM)"
    probe = subprocess.run([python, "-c", "import playwright, PIL"], capture_output=True)
    return None if probe.returncode == 0 else f"{python} cannot import playwright and Pillow"


def _frontend_report(script: str, tmp_path) -> dict:
    """The JSON report of one of the real-frontend drivers beside this file, run with ComfyUI's Python."""
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    missing = _frontend_tools(python)
    if missing:
        pytest.skip(missing)
    out = tmp_path / "report.json"
    result = subprocess.run([python, str(ROOT / "tests" / "nodes" / script), "--comfyui", COMFYUI, "--python", python,
                             "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not COMFYUI, reason="set COMFYUI_PATH to a ComfyUI checkout to run against its real frontend")
def test_workflows_open_cleanly_in_the_real_frontend(tmp_path):
    """Every workflow, loaded by the real frontend: no overlaps, on screen and clear of the sidebar, top bars and
    minimap, nothing flagged, and node sizes as the CPU check (recorded sizes) predicts them."""
    real = _frontend_report("real_frontend.py", tmp_path)
    sizes = wt.frontend_sizes()
    assert real["frontend_version"] == sizes["frontend"]
    for path in sorted((ROOT / "workflows").glob("*.json")):
        wf = json.loads(path.read_text())
        th = sizes["title_height"]
        # node ids as the workflow has them: frontend 1.58 reports them as strings
        boxes = {int(n["id"]): (n["pos"][0], n["pos"][1] - th, n["size"][0], n["size"][1] + th)
                 for n in real[path.stem]["nodes"]}
        assert wt.layout_problems(wf, sizes, boxes) == [], path.stem
        # nothing flagged on open: no toast (e.g. "my_voice.safetensors is missing"), no node outlined red
        assert real[path.stem]["problems"] == {"toasts": [], "error_nodes": []}, path.stem
        predicted = wt.node_boxes(wf, sizes)
        for nid, (x, y, w, h) in boxes.items():
            px, py, pw, ph = predicted[nid]
            # the recorded character widths ignore kerning, so long titles come out up to a few px wider
            assert -0.5 <= pw - w <= 0.01 * w + 1 and abs(ph - h) < 0.5, (path.stem, nid, (pw, ph), (w, h))


@pytest.mark.skipif(not COMFYUI, reason="set COMFYUI_PATH to a ComfyUI checkout to run against its real frontend")
def test_messages_stay_on_their_node_after_the_job_in_the_real_frontend(tmp_path):
    """nodes/web/messages.js in the real frontend: a warning still shown, whole, once the job has ended (newer
    frontends clear progress text then), replaced after a clean run, never saved into the workflow."""
    report = _frontend_report("real_frontend_messages.py", tmp_path)
    [swapped], [clean] = report["swapped"], report["clean"]
    assert swapped["type"] == clean["type"] == "Qwen3TTSMorphGenerate"
    assert swapped["text"].startswith("Warning: ") and "the text to speak is the same as the voice's transcript" \
        in swapped["text"] and swapped["on_screen"] and swapped["whole"]
    assert clean["text"] == "No warnings in this run." and clean["on_screen"] and clean["whole"]
    assert report["saved_widgets_values"] == 16 and report["console_errors"] == []
    # Render Lines stopped by an interrupt: its progress line gives way to the lines its folder holds
    stopped, files = report["stopped"]["messages"], report["stopped"]["files"]
    [render] = [m for m in stopped if m["type"] == "Qwen3TTSMorphRenderLines"]
    assert 0 < len(files) < 10 and render["on_screen"] and render["whole"]
    assert render["text"].split("\n")[-1] == (f"Qwen3-TTS Render Lines: stopped: {len(files)} of 10 lines kept; queue "
                                              "it again with resume on to render the rest")
