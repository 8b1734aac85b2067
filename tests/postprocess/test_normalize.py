import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from postprocess import peak_normalize

MINUS_3_DB = 0.7079457843841379


def peaks(out):
    return np.abs(out).reshape(out.shape[0], -1).max(axis=1)


def test_each_item_peaks_at_target():
    rng = np.random.default_rng(0)
    audio = rng.uniform(-1, 1, (3, 2, 400)) * np.array([0.01, 1.0, 50.0])[:, None, None]
    out = peak_normalize(audio)
    assert out.dtype == np.float32 and out.shape == audio.shape
    np.testing.assert_allclose(peaks(out), MINUS_3_DB, rtol=1e-6)
    # One gain per item: the waveform and the balance between channels are kept.
    expected = audio / np.abs(audio).max(axis=(1, 2), keepdims=True) * MINUS_3_DB
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("target_dbfs", [0.0, -1.0, -20.0])
def test_target_levels(target_dbfs):
    out = peak_normalize(np.array([0.1, -0.4, 0.2]), target_dbfs)
    assert np.abs(out).max() == pytest.approx(10 ** (target_dbfs / 20), rel=1e-6)
    assert out[1] < 0


@pytest.mark.parametrize("shape", [(500,), (2, 500)])
def test_unbatched_input_is_one_item(shape):
    audio = np.random.default_rng(1).uniform(-1, 1, shape)
    audio[..., 0] = 2.0
    out = peak_normalize(audio)
    assert out.shape == shape
    np.testing.assert_allclose(out, audio / 2.0 * MINUS_3_DB, rtol=1e-6, atol=1e-7)


def test_silence_stays_silence():
    audio = np.zeros((3, 1, 100))
    audio[1] = 0.5
    audio[2, 0, 3] = 1e-12
    out = peak_normalize(audio)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[0], 0)
    np.testing.assert_array_equal(out[2], 0)
    assert np.abs(out[1]).max() == pytest.approx(MINUS_3_DB, rel=1e-6)


def test_empty_audio():
    assert peak_normalize(np.zeros((2, 1, 0))).shape == (2, 1, 0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_audio_raises(bad):
    with pytest.raises(ValueError, match="NaN"):
        peak_normalize(np.array([0.0, bad, 0.5]))


@pytest.mark.parametrize("target_dbfs", [0.5, float("nan"), float("inf"), float("-inf")])
def test_bad_target_raises(target_dbfs):
    with pytest.raises(ValueError, match="finite level <= 0 dBFS"):
        peak_normalize(np.ones(4), target_dbfs)


@settings(deadline=None)
@given(
    audio=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=3, max_dims=3, max_side=8),
        elements=st.floats(allow_nan=False, allow_infinity=False),
    ),
    target_dbfs=st.floats(-60, 0),
)
def test_peak_is_target_or_zero(audio, target_dbfs):
    out = peak_normalize(audio, target_dbfs)
    assert out.shape == audio.shape and not np.isnan(out).any()
    silent = np.abs(audio).reshape(audio.shape[0], -1).max(axis=1) < 1e-9
    np.testing.assert_array_equal(peaks(out)[silent], 0)
    np.testing.assert_allclose(peaks(out)[~silent], 10 ** (target_dbfs / 20), rtol=1e-6)
