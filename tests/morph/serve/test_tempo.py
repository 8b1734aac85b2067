"""`speed` (morph/serve/tempo.py): FFmpeg's atempo through PyAV stretches a clip to 1/speed of its length at the same
pitch, chained for 0.25 and 4.0; a stream stretched chunk by chunk is the whole clip's stretch; out of range is
refused."""

import numpy as np
import pytest

from morph.serve.tempo import MAX_SPEED, MIN_SPEED, Stretch, stretched
from morph.settings import SAMPLE_RATE


def sine(hz=300.0, seconds=2.0) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def dominant_hz(audio: np.ndarray) -> float:
    middle = audio[audio.size // 8: -audio.size // 8]  # away from the filter's ramps in and out
    spectrum = np.abs(np.fft.rfft(middle * np.hanning(middle.size)))
    return float(np.argmax(spectrum) * SAMPLE_RATE / middle.size)


@pytest.mark.parametrize("speed", [MIN_SPEED, 0.5, 0.8, 2.0, 3.0, MAX_SPEED])
def test_a_stretch_is_1_over_speed_as_long_at_the_same_pitch(speed):
    audio = sine()
    out = stretched(audio, speed)
    assert out.dtype == np.float32
    assert abs(out.size / (audio.size / speed) - 1) < 0.03, out.size
    assert abs(dominant_hz(out) - 300) < 3  # a resampler would move it to 300 * speed
    assert abs(np.sqrt(np.mean(out**2)) / np.sqrt(np.mean(audio**2)) - 1) < 0.1  # as loud: windows blended, not gaps


@pytest.mark.parametrize("speed", [0.5, 2.0, MAX_SPEED])
def test_a_stream_stretched_chunk_by_chunk_is_the_whole_clips_stretch(speed):
    audio = sine(seconds=1.5)
    stretch = Stretch(speed)
    cuts = [0, 700, 701, 9000, 20000, audio.size]
    parts = [stretch.feed(audio[a:b]) for a, b in zip(cuts, cuts[1:])]
    assert sum(p.size for p in parts) > 0.8 * audio.size / speed  # handed out as it comes, a window behind
    np.testing.assert_array_equal(np.concatenate(parts + [stretch.finish()]), stretched(audio, speed))


def test_speed_1_passes_the_audio_through_and_the_range_is_openais():
    audio = sine(seconds=0.1)
    stretch = Stretch(1.0)
    assert stretch.feed(audio) is audio and stretch.finish().size == 0
    assert (MIN_SPEED, MAX_SPEED) == (0.25, 4.0)
    for speed in (0.2, 4.5, 0.0):
        with pytest.raises(ValueError, match=r"speed: .* out of range; send 0.25 to 4.0"):
            Stretch(speed)
