"""Shared fixtures: tiny random-weight Qwen3-TTS checkpoints, built once per test session."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.random_model import build_random_model

SR = 24000


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """Build each tiny checkpoint on first use: {(size, variant): path}."""
    root = tmp_path_factory.mktemp("models")
    built = {}

    def get(size: str = "tiny", variant: str = "base"):
        key = (size, variant)
        if key not in built:
            built[key] = build_random_model(root / f"{size}-{variant}", size, variant, seed=0)
        return built[key]

    return get


@pytest.fixture(scope="session")
def tiny_dir(model_dirs):
    return model_dirs("tiny", "base")


@pytest.fixture(scope="session")
def tiny_tts(tiny_dir):
    """The tiny Base model loaded through the pack's own loader (fp32, sdpa, CPU)."""
    from morph.api import MorphTTS

    return MorphTTS.load(str(tiny_dir), device="cpu", dtype="fp32", attention="sdpa")


def two_second_clip() -> tuple[np.ndarray, int]:
    """Two seconds of noisy 'speech' at 24 kHz: what the tiny speaker encoder needs."""
    rng = np.random.RandomState(0)
    t = np.arange(2 * SR) / SR
    wave = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.randn(t.size)
    return wave.astype(np.float32), SR


@pytest.fixture
def ref_audio():
    """two_second_clip(), a fresh copy for each test."""
    return two_second_clip()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.fixture
def no_load(monkeypatch):
    """For the CLI's checks: every one must fail before the model loads."""
    from morph.api import MorphTTS

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(MorphTTS, "load", load)
