"""Fixtures for the node tests: the pack imported the way ComfyUI imports it, tiny models in a
models folder, and ComfyUI's services simulated at the seam."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from . import fake_comfy

ROOT = Path(__file__).resolve().parents[2]
PACK_NAME = "qwen3tts_morph_pack_under_test"
SR = 24000


def import_pack(name: str = PACK_NAME):
    """Exec the repo's root __init__.py as a package, as ComfyUI's load_custom_node does."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@pytest.fixture(scope="session")
def models_root(tmp_path_factory, model_dirs):
    """The models/qwen3-tts folder (via $QWEN3TTS_MODELS_DIR) holding the tiny checkpoints."""
    root = tmp_path_factory.mktemp("qwen3-tts")
    for variant in ("base", "custom_voice", "voice_design"):
        (root / f"tiny-{variant}").symlink_to(model_dirs("tiny", variant), target_is_directory=True)
    old = os.environ.get("QWEN3TTS_MODELS_DIR")
    os.environ["QWEN3TTS_MODELS_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("QWEN3TTS_MODELS_DIR", None)
    else:
        os.environ["QWEN3TTS_MODELS_DIR"] = old


@pytest.fixture(scope="session")
def pack():
    assert not fake_comfy.comfy_loaded(), "the pack must import with no ComfyUI present"
    return import_pack()


@pytest.fixture(scope="session")
def nodes(pack):
    return pack.NODE_CLASS_MAPPINGS


def _load(nodes, name):
    return nodes["Qwen3TTSMorphLoadModel"]().load(model=name, dtype="fp32", attention="sdpa", device="cpu")[0]


@pytest.fixture(scope="session")
def base_model(nodes, models_root):
    return _load(nodes, "tiny-base")


@pytest.fixture(scope="session")
def custom_model(nodes, models_root):
    return _load(nodes, "tiny-custom_voice")


@pytest.fixture(scope="session")
def design_model(nodes, models_root):
    return _load(nodes, "tiny-voice_design")


@pytest.fixture
def ref_clip():
    """Two seconds of stereo 'speech' at 44.1 kHz, as ComfyUI's Load Audio gives it: [1, 2, T]."""
    import torch

    rate = 44100
    rng = np.random.RandomState(0)
    t = np.arange(2 * rate) / rate
    wave = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.randn(t.size)
    stereo = np.stack([wave, 0.8 * wave]).astype(np.float32)
    return {"waveform": torch.from_numpy(stereo)[None], "sample_rate": rate}


@pytest.fixture(scope="session")
def base_voice(nodes, base_model):
    import torch

    rng = np.random.RandomState(1)
    t = np.arange(2 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 150 * t) + 0.05 * rng.randn(t.size)).astype(np.float32)
    audio = {"waveform": torch.from_numpy(wave)[None, None], "sample_rate": SR}
    # x-vector only: an ICL voice makes every generation decode its reference codes too (slower tests)
    return nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, audio, "", False)[0]


@pytest.fixture
def comfy(tmp_path):
    """ComfyUI's services simulated at the seam, for one test."""
    rec = fake_comfy.install(str(tmp_path / "comfy_models"))
    yield rec
    fake_comfy.uninstall()


def gen_options(**overrides):
    """Generate-node keyword arguments: quick, bounded runs on the tiny models."""
    options = dict(language="English", seq_groups=5, seed=1, max_new_tokens=4, do_sample=True, temperature=0.9,
                   top_k=50, top_p=1.0, repetition_penalty=1.05, subtalker_do_sample=True,
                   subtalker_temperature=0.9, subtalker_top_k=50, subtalker_top_p=1.0)
    options.update(overrides)
    return options
