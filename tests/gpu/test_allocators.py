"""Capture and run under each CUDA allocator backend, each in its own process (the backend is
fixed per process): ComfyUI's default cudaMallocAsync and the native caching allocator."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import json, sys, torch
from morph.api import MorphTTS
from morph.settings import GenerationSettings
import numpy as np
tts = MorphTTS.load(sys.argv[1], device="cuda", dtype="fp32")
wave = (0.3 * np.sin(2 * np.pi * 180 * np.arange(48000) / 24000)).astype(np.float32)
voice = tts.make_voice(wave, 24000, transcript="A short reference sentence.")
out = {"backend": torch.cuda.get_allocator_backend()}
for mode in ("lean", "graphs", "fused"):
    tts.patch.mode = mode
    audio = tts.clone("Every mode under this allocator.", voice, "English", GenerationSettings(seq_groups=5, seed=1,
                      max_new_tokens=16))
    out[mode] = [tts.patch.last_run["mode"], audio.size, float(np.abs(audio).sum())]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_every_mode_captures_and_runs(tiny_dir, backend):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if backend == "cudaMallocAsync":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_dir)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.split("RESULT ", 1)[1])
    assert result["backend"] == backend
    for mode in ("lean", "graphs", "fused"):
        assert result[mode][0] == mode and result[mode][1] > 0
    # the fast modes decode the same codes as op by op, so the same audio
    for mode in ("graphs", "fused"):
        assert result[mode] == [mode, *result["lean"][1:]]
