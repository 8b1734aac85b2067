"""The pack's default post-processing of one line: what Smooth & Normalize does with its defaults."""

import numpy as np

from .lowpass import lowpass
from .normalize import peak_normalize


def smooth(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Low-pass at DEFAULT_CUTOFF_HZ, then peak-normalise to DEFAULT_PEAK_DBFS; contiguous float32. Empty audio
    (a line that ended at once) comes back as it is: the filter needs samples."""
    if audio.size == 0:
        return audio
    return np.ascontiguousarray(peak_normalize(lowpass(audio, sample_rate)), dtype=np.float32)
