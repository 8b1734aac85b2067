import logging

import numpy as np
import pytest
from scipy.signal import sosfreqz

from postprocess import DEFAULT_CUTOFF_HZ, design_lowpass, lowpass

SAMPLE_RATES = [16000, 22050, 24000, 44100, 48000]


def measured_gain(sample_rate, cutoff_hz, order=2):
    """|H| at every whole-Hz frequency, from the FFT of a one-second impulse response."""
    impulse = np.zeros(sample_rate)
    impulse[0] = 1.0
    return np.abs(np.fft.rfft(lowpass(impulse, sample_rate, cutoff_hz, order)))


def butterworth_gain(f, fc, sample_rate, order):
    """Analytic magnitude of a bilinear-transform Butterworth (frequencies pre-warped)."""
    warp = np.tan(np.pi * f / sample_rate) / np.tan(np.pi * fc / sample_rate)
    return 1 / np.sqrt(1 + warp ** (2 * order))


@pytest.mark.parametrize(
    "sample_rate, freqs",
    [(48000, [1000, 5000, 11000, 15000, 20000]), (24000, [1000, 5000, 8000, 11000])],
)
@pytest.mark.parametrize("order", [1, 2, 4])
def test_magnitude_matches_design_and_analytic(sample_rate, freqs, order):
    gain = measured_gain(sample_rate, DEFAULT_CUTOFF_HZ, order)[freqs]
    _, designed = sosfreqz(design_lowpass(DEFAULT_CUTOFF_HZ, sample_rate, order), worN=freqs, fs=sample_rate)
    np.testing.assert_allclose(gain, np.abs(designed), atol=1e-5)
    np.testing.assert_allclose(gain, butterworth_gain(np.array(freqs), DEFAULT_CUTOFF_HZ, sample_rate, order), atol=1e-5)


@pytest.mark.parametrize("sample_rate", SAMPLE_RATES)
def test_minus_3_db_at_cutoff_and_full_spectrum(sample_rate):
    cutoff = 3000
    gain = measured_gain(sample_rate, cutoff)
    # Causal filtering: a zero-phase filtfilt would give -6 dB here.
    assert 20 * np.log10(gain[cutoff]) == pytest.approx(-3.0103, abs=1e-3)
    assert gain[100] == pytest.approx(1.0, abs=1e-3)
    _, designed = sosfreqz(design_lowpass(cutoff, sample_rate), worN=np.arange(gain.size), fs=sample_rate)
    np.testing.assert_allclose(gain, np.abs(designed), atol=1e-5)


def test_sine_above_cutoff_is_attenuated():
    t = np.arange(48000) / 48000
    low = lowpass(np.sin(2 * np.pi * 1000 * t), 48000)[4800:]
    high = lowpass(np.sin(2 * np.pi * 20000 * t), 48000)[4800:]
    assert np.abs(low).max() == pytest.approx(1.0, abs=0.01)
    assert np.abs(high).max() < 0.3


@pytest.mark.parametrize("sample_rate, cutoff", [(16000, DEFAULT_CUTOFF_HZ), (24000, 12000), (48000, 30000)])
def test_cutoff_at_or_above_nyquist_leaves_audio_unchanged(sample_rate, cutoff, caplog):
    audio = np.random.default_rng(0).uniform(-1, 1, (2, 1, 500)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="postprocess"):
        out = lowpass(audio, sample_rate, cutoff)
    np.testing.assert_array_equal(out, audio)
    assert design_lowpass(cutoff, sample_rate) is None
    assert "Nyquist" in caplog.text and "unfiltered" in caplog.text


@pytest.mark.parametrize("order", [0, -1, 1.5])
def test_bad_order_raises(order):
    with pytest.raises(ValueError, match="order must be an integer >= 1"):
        design_lowpass(1000, 48000, order)


@pytest.mark.parametrize("cutoff", [0, -5, float("nan"), float("inf")])
def test_bad_cutoff_raises(cutoff):
    with pytest.raises(ValueError, match="cutoff must be a finite frequency > 0 Hz"):
        lowpass(np.zeros(10), 48000, cutoff)


def test_bad_sample_rate_raises():
    with pytest.raises(ValueError, match="sample rate must be > 0"):
        design_lowpass(1000, 0)


def test_batch_items_and_channels_filtered_independently():
    rng = np.random.default_rng(1)
    audio = rng.uniform(-1, 1, (3, 2, 1000))
    out = lowpass(audio, 24000)
    assert out.shape == audio.shape and out.dtype == np.float32
    for b in range(3):
        for c in range(2):
            np.testing.assert_array_equal(out[b, c], lowpass(audio[b, c], 24000))
    changed = audio.copy()
    changed[1] = rng.uniform(-1, 1, (2, 1000))
    np.testing.assert_array_equal(lowpass(changed, 24000)[0], out[0])


@pytest.mark.parametrize("shape", [(1000,), (2, 1000), (2, 3, 1000), (2, 1, 0), (0,)])
def test_shape_kept_and_float32(shape):
    out = lowpass(np.ones(shape), 24000)
    assert out.shape == shape and out.dtype == np.float32


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_audio_raises(bad):
    audio = np.zeros((1, 1, 100), np.float32)
    audio[0, 0, 50] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        lowpass(audio, 24000)


def test_wrong_rank_raises():
    with pytest.raises(ValueError, match=r"\[B, C, T\]"):
        lowpass(np.zeros((1, 1, 1, 10)), 24000)
