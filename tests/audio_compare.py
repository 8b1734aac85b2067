"""Audio compared relative to its size: an absolute tolerance says nothing about a signal near or below it (two
near-silent clips agree to any atol), so the reference must be audible and the tolerance is a share of its peak."""

from __future__ import annotations

import numpy as np


def assert_audio_close(got, want, rel: float, floor: float = 1e-3) -> None:
    """`got` equals `want` to `rel` of want's peak, sample by sample; `want`'s peak must be at least `floor` (-60
    dBFS), else the comparison would pass on silence."""
    got, want = (np.asarray(a.detach().cpu() if hasattr(a, "detach") else a, dtype=np.float64) for a in (got, want))
    assert got.shape == want.shape, (got.shape, want.shape)
    if not want.size:  # a row that made no audio: its shape is the comparison
        return
    peak = float(np.abs(want).max())
    assert peak >= floor, f"the reference is near silent (peak {peak:.2e}): the comparison would prove nothing"
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * peak)
