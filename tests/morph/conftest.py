"""Fixtures the engine's tests share."""

import pytest

from tests.morph import golden


@pytest.fixture(scope="module")
def voices(tiny_tts):
    """An x-vector voice and an ICL one, from one clean two-second clip: the golden codes' (tests/morph/golden.py).
    Files that need another clip, or other keys, define their own `voices`, which pytest takes over this one."""
    return golden.voices(tiny_tts)


@pytest.fixture
def lean(tiny_tts):
    """The tiny model in mode "lean", what the continuous batch, the live engine and the server run on the CPU; back
    to auto, its device state released, after the test."""
    tiny_tts.patch.mode = "lean"
    yield tiny_tts
    tiny_tts.patch.mode = "auto"
    tiny_tts.release_device_state()
