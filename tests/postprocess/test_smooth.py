"""postprocess.smooth: the low-pass then the peak normalisation at their defaults, as one call (Render Lines and
`cli.py render` smooth each line with it); empty audio passes through."""

import numpy as np

from postprocess import DEFAULT_PEAK_DBFS, lowpass, peak_normalize, smooth


def test_smooth_is_the_lowpass_then_the_peak_at_their_defaults():
    rng = np.random.default_rng(0)
    wav = (0.3 * rng.standard_normal(24000)).astype(np.float32)
    got = smooth(wav, 24000)
    np.testing.assert_array_equal(got, peak_normalize(lowpass(wav, 24000)))
    assert got.dtype == np.float32 and got.flags["C_CONTIGUOUS"]
    assert abs(np.abs(got).max() - 10 ** (DEFAULT_PEAK_DBFS / 20)) < 1e-6


def test_empty_audio_passes_through():
    empty = np.zeros(0, np.float32)
    assert smooth(empty, 24000) is empty
