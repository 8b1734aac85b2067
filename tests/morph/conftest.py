"""Fixtures the engine's tests share."""

import numpy as np
import pytest

SR = 24000


@pytest.fixture(scope="module")
def voices(tiny_tts):
    """An x-vector voice and an ICL one, from one clean two-second clip (files that need another clip, or other
    keys, define their own `voices`, which pytest takes over this one)."""
    t = np.arange(2 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return {"xvec": tiny_tts.make_voice(wave, SR),
            "icl": tiny_tts.make_voice(wave, SR, transcript="A short reference sentence.")}


@pytest.fixture
def lean(tiny_tts):
    """The tiny model in mode "lean", what the continuous batch, the live engine and the server run on the CPU; back
    to auto, its device state released, after the test."""
    tiny_tts.patch.mode = "lean"
    yield tiny_tts
    tiny_tts.patch.mode = "auto"
    tiny_tts.release_device_state()
