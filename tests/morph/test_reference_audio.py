"""Reference clips of any shape, rate and scale, and the clips that must be refused."""

import logging

import numpy as np
import pytest
import torch

from morph.reference_audio import prepare_reference

SR = 24000


def speechlike(seconds, sr, channels=None):
    t = np.arange(int(seconds * sr)) / sr
    mono = (0.3 * np.sin(2 * np.pi * 200 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    return mono if channels is None else np.stack([mono * (c + 1) / channels for c in range(channels)])


@pytest.mark.parametrize("sr", [8000, 16000, 44100, 48000, 24000])
def test_stereo_at_any_rate_becomes_mono_24k(sr):
    out = prepare_reference(speechlike(2.0, sr, channels=2), sr)
    assert out.ndim == 1 and out.dtype == np.float32
    assert abs(out.size - 2 * SR) <= 2


def test_comfy_audio_layout_and_torch_input():
    wave = torch.from_numpy(speechlike(1.5, SR, channels=1))[None]  # [1, 1, T]
    assert prepare_reference(wave, SR).shape == (int(1.5 * SR),)


@pytest.mark.parametrize("layout", ["T", "CT", "TC", "BCT", "torch TC"])
def test_every_common_layout_gives_the_same_mono_clip(layout):
    stereo = speechlike(2.0, SR, channels=2)  # [C, T]
    expected = stereo.mean(axis=0)
    wave = {"T": expected, "CT": stereo, "TC": stereo.T.copy(), "BCT": stereo[None],
            "torch TC": torch.from_numpy(stereo.T.copy())}[layout]
    np.testing.assert_allclose(prepare_reference(wave, SR), expected, atol=1e-6)


def test_soundfile_stereo_is_read_as_2_s_not_0_s(tmp_path):
    import soundfile as sf

    sf.write(tmp_path / "s.wav", speechlike(2.0, SR, channels=2).T, SR)
    wave, rate = sf.read(tmp_path / "s.wav", dtype="float32")  # [T, 2]
    assert prepare_reference(wave, rate).size == 2 * SR


@pytest.mark.parametrize("shape", [(9, 9), (20, 30)])
def test_an_ambiguous_2d_shape_is_refused(shape):
    with pytest.raises(ValueError, match=r"Voice prompt: cannot tell channels from samples in audio shaped "
                                         rf"\[{shape[0]}, {shape[1]}\]; give it as \[channels, samples\]"):
        prepare_reference(np.full(shape, 0.1, np.float32), SR, "Voice prompt")


def test_a_transcript_for_a_clip_longer_than_30_s_is_refused_not_silently_mismatched():
    with pytest.raises(ValueError, match="the clip is 35.0 s long, and only its first 30 s can be used, but the "
                                         "transcript is for the whole clip.*Trim the clip to 30 s or less"):
        prepare_reference(speechlike(35.0, 16000), 16000, "Voice prompt", icl=True)
    assert prepare_reference(speechlike(29.0, 16000), 16000, icl=True).size == 29 * SR


def test_int16_range_is_rescaled(caplog):
    caplog.set_level(logging.INFO)
    loud = speechlike(2.0, SR) * 20000
    out = prepare_reference(loud, SR)
    assert 0.1 < np.abs(out).max() <= 1.0
    assert "int16" in caplog.text


def test_long_clip_is_trimmed_with_a_warning(caplog):
    out = prepare_reference(speechlike(35.0, 16000), 16000)
    assert out.size == 30 * SR
    assert "only its first 30 s" in caplog.text


@pytest.mark.parametrize("wave, sr, match", [
    (np.zeros(3 * SR, np.float32), SR, "silent"),
    (speechlike(0.5, SR), SR, "at least 1 s"),
    (np.full(2 * SR, np.nan, np.float32), SR, "NaN"),
    (np.concatenate([speechlike(2, SR), [np.inf]]), SR, "NaN or infinite"),
    (speechlike(2, SR) * 1e6, SR, "outside any audio range"),
    (np.zeros((2, 1, 100)), SR, "batch of 2"),
])
def test_bad_clips_are_refused_clearly(wave, sr, match):
    with pytest.raises(ValueError, match=f"Voice prompt: .*{match}"):
        prepare_reference(wave, sr, "Voice prompt")
