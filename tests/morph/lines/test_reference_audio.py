"""Reference clips of any shape, rate and scale, and the clips that must be refused."""

import logging

import numpy as np
import pytest
import torch

from morph.lines.reference_audio import prepare_reference
from morph.lines.words import FOR_CLI, FOR_NODES, FOR_PYTHON
from tests.clips import clip_names, write_clip

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


def test_eight_channels_either_way_round_and_a_bf16_waveform_are_read():
    """MAX_CHANNELS (8) channels is still a clip in both layouts; a bf16 tensor (torch.numpy() refuses bf16) too."""
    eight = np.repeat(speechlike(1.0, SR)[None], 8, axis=0)  # [8, T]
    for wave in (eight, eight.T.copy()):
        np.testing.assert_allclose(prepare_reference(wave, SR), eight[0], atol=1e-6)
    bf16 = torch.from_numpy(eight[:2])[None].to(torch.bfloat16)  # ComfyUI's [1, C, T]
    np.testing.assert_array_equal(prepare_reference(bf16, SR), prepare_reference(bf16.float(), SR))


def test_soundfile_stereo_is_read_as_2_s_not_0_s(tmp_path):
    import soundfile as sf

    sf.write(tmp_path / "s.wav", speechlike(2.0, SR, channels=2).T, SR)
    wave, rate = sf.read(tmp_path / "s.wav", dtype="float32")  # [T, 2]
    assert prepare_reference(wave, rate).size == 2 * SR


@pytest.mark.parametrize("shape", [(9, 9), (8, 8), (20, 30), (30, 20)])
def test_an_ambiguous_2d_shape_is_refused(shape):
    with pytest.raises(ValueError, match=r"Voice prompt: cannot tell channels from samples in audio shaped "
                                         rf"\[{shape[0]}, {shape[1]}\]; give it as \[channels, samples\]"):
        prepare_reference(np.full(shape, 0.1, np.float32), SR, "Voice prompt")


def test_a_transcript_for_a_clip_longer_than_30_s_is_refused_not_silently_mismatched():
    with pytest.raises(ValueError, match="the clip is 35.0 s long, and only its first 30 s can be used, but the "
                                         "transcript is for the whole clip.*Trim the clip to 30 s or less"):
        prepare_reference(speechlike(35.0, 16000), 16000, "Voice prompt", icl=True)
    assert prepare_reference(speechlike(29.0, 16000), 16000, icl=True).size == 29 * SR


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.uint8, "torch int16"])
def test_integer_samples_are_pcm_scaled_by_their_type(dtype, caplog):
    caplog.set_level(logging.INFO)
    wave = speechlike(2.0, SR)  # peak 0.6
    if dtype == np.uint8:
        pcm, expected = np.round(wave * 128 + 128).astype(np.uint8), (np.round(wave * 128) / 128)
    else:
        bits = 16 if dtype == "torch int16" else np.iinfo(dtype).bits
        expected = np.round(wave * 2.0 ** (bits - 1)) / 2.0 ** (bits - 1)
        pcm = (expected * 2.0 ** (bits - 1)).astype(np.int16 if dtype == "torch int16" else dtype)
        pcm = torch.from_numpy(pcm) if dtype == "torch int16" else pcm
    np.testing.assert_allclose(prepare_reference(pcm, SR), expected, atol=1e-6)
    assert caplog.text == ""  # integer PCM needs no note


@pytest.mark.parametrize("peak", [1.006, 1.2, 40000.0])
def test_float_samples_over_full_scale_are_normalised_with_one_note_never_read_as_int16(peak, caplog):
    caplog.set_level(logging.INFO)
    wave = speechlike(2.0, SR)
    wave = wave / np.abs(wave).max() * peak
    out = prepare_reference(wave, SR, "Voice prompt")
    np.testing.assert_allclose(out, wave / peak, atol=1e-6)
    assert np.abs(out).max() == pytest.approx(1.0, abs=1e-6)
    assert caplog.messages == [f"Voice prompt: float samples peak at {peak:.4g}, above 1.0; scaled down to peak at 1.0"]


def test_float_samples_within_full_scale_are_kept_as_they_are(caplog):
    caplog.set_level(logging.INFO)
    wave = speechlike(2.0, SR)
    wave = wave / np.abs(wave).max() * 0.9986
    np.testing.assert_array_equal(prepare_reference(wave, SR), wave)
    assert caplog.text == ""


def test_resampling_overshoot_is_scaled_back_silently_and_a_prepared_clip_is_kept(tmp_path, caplog):
    """The bug a newcomer met: resampling 22.05 kHz to 24 kHz overshoots to above 1.0, and a second
    preparation read that as int16 and called the clip silent."""
    import soundfile as sf
    from scipy.signal import resample_poly

    caplog.set_level(logging.INFO)
    path = write_clip("espeak-like int16 WAV, 22.05 kHz, peak 0.9986", tmp_path)
    wave, rate = sf.read(path, dtype="float32")
    assert np.abs(resample_poly(wave.astype(np.float64), 160, 147)).max() > 1.2  # the overshoot this is about
    once = prepare_reference(wave, rate)
    assert np.abs(once).max() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(prepare_reference(once, SR), once, atol=1e-6)
    assert caplog.text == ""  # the caller's samples were within full scale


def test_the_fixes_are_worded_for_the_caller():
    silent = np.zeros(2 * SR, np.float32)
    for words in (FOR_NODES, FOR_PYTHON, FOR_CLI):
        with pytest.raises(ValueError, match=f"^who: the clip is silent; {words.new_clip}$"):
            prepare_reference(silent, SR, "who", words=words)
        with pytest.raises(ValueError) as long_clip:
            prepare_reference(speechlike(31.0, 16000), 16000, "who", icl=True, words=words)
        assert f"or {words.no_transcript} to clone from the first 30 s" in str(long_clip.value)
    assert "x_vector_only=True" in FOR_PYTHON.no_transcript and "turn on x_vector_only" in FOR_NODES.no_transcript


@pytest.mark.parametrize("name", clip_names())
def test_every_common_clip_file_makes_a_voice_through_the_api(name, tiny_tts, tmp_path, caplog):
    """As the README's Python API reads a clip (soundfile's floats), and as integer PCM where the file is PCM."""
    import soundfile as sf

    caplog.set_level(logging.INFO)
    path = write_clip(name, tmp_path)
    wave, rate = sf.read(path)
    voice = tiny_tts.make_voice(wave, rate, transcript="A short reference sentence.")
    assert voice.icl and torch.isfinite(voice.spk_embedding).all()
    assert ("scaled down to peak at 1.0" in caplog.text) == (np.abs(wave).max() > 1.0)
    if sf.info(str(path)).subtype.startswith("PCM"):
        pcm, _ = sf.read(path, dtype="int16")
        assert tiny_tts.make_voice(pcm, rate).spk_embedding.shape == voice.spk_embedding.shape


def test_long_clip_is_trimmed_with_a_warning(caplog):
    out = prepare_reference(speechlike(35.0, 16000), 16000)
    assert out.size == 30 * SR
    assert "only its first 30 s" in caplog.text


@pytest.mark.parametrize("wave, sr, match", [
    (np.zeros(3 * SR, np.float32), SR, "silent"),
    (speechlike(0.5, SR), SR, "at least 1 s"),
    (np.full(2 * SR, np.nan, np.float32), SR, "NaN"),
    (np.concatenate([speechlike(2, SR), [np.inf]]), SR, "NaN or infinite"),
    (np.full(2 * SR, True), SR, "audio samples must be numbers, got bool"),
    (np.zeros((2, 1, 100)), SR, "batch of 2"),
])
def test_bad_clips_are_refused_clearly(wave, sr, match):
    with pytest.raises(ValueError, match=f"Voice prompt: .*{match}"):
        prepare_reference(wave, sr, "Voice prompt")


@pytest.mark.parametrize("dbfs, silent", [(-70, False), (-90, True)])
def test_quiet_speech_is_kept_and_only_near_silence_refused(dbfs, silent):
    """The silence floor is -80 dBFS (RMS): a quiet recording at -70 is a voice, a hiss at -90 is not."""
    rng = np.random.default_rng(0)
    wave = rng.standard_normal(2 * SR)
    wave = (wave / np.sqrt(np.mean(wave**2)) * 10 ** (dbfs / 20)).astype(np.float32)
    if silent:
        with pytest.raises(ValueError, match="the clip is silent"):
            prepare_reference(wave, SR)
    else:
        assert prepare_reference(wave, SR).size == wave.size
