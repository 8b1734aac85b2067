"""Peak normalisation of synthesised speech."""

import math

import numpy as np

from ._checks import as_audio

DEFAULT_PEAK_DBFS = -3.0

# Peaks below this (about -180 dBFS) are treated as silence rather than amplified.
SILENCE_PEAK = 1e-9


def peak_normalize(audio: np.ndarray, target_dbfs: float = DEFAULT_PEAK_DBFS) -> np.ndarray:
    """Scale audio so its absolute peak is ``10 ** (target_dbfs / 20)``.

    Each item of a [B, C, T] batch is scaled on its own, by one gain across
    its channels; [T] and [C, T] are one item. Silent items (peak below
    1e-9) come back as exact zeros. Returns float32 of the input's shape.
    Raises ValueError for NaN/inf samples or a target that is not a finite
    value <= 0 dBFS.
    """
    if not math.isfinite(target_dbfs) or target_dbfs > 0:
        raise ValueError(f"peak target must be a finite level <= 0 dBFS, got {target_dbfs}; use e.g. {DEFAULT_PEAK_DBFS}")
    x = as_audio(audio)
    if x.size == 0:
        return x.astype(np.float32)
    items = x.reshape(x.shape[0] if x.ndim == 3 else 1, -1)
    peaks = np.abs(items).max(axis=1, keepdims=True)
    # Dividing by the peak first makes the loudest sample exactly +-1 before
    # the target gain, and avoids underflow when the peak is huge.
    unit = np.divide(items, peaks, out=np.zeros_like(items), where=peaks >= SILENCE_PEAK)
    return (unit * 10 ** (target_dbfs / 20)).reshape(x.shape).astype(np.float32)
