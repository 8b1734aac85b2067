"""Input validation shared by the post-processing steps."""

import numpy as np


def as_audio(audio) -> np.ndarray:
    """Return ``audio`` as a float64 array shaped [T], [C, T] or [B, C, T].

    Raises ValueError for any other rank, or if any sample is NaN or inf.
    """
    x = np.asarray(audio, dtype=np.float64)
    if not 1 <= x.ndim <= 3:
        raise ValueError(f"audio must be shaped [T], [C, T] or [B, C, T], got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(
            "audio contains NaN or inf samples; replace them (e.g. with np.nan_to_num) "
            "before post-processing"
        )
    return x
