"""Post-processing of synthesised audio: low-pass smoothing and peak normalisation.

Depends only on numpy and scipy.
"""

from .lowpass import DEFAULT_CUTOFF_HZ, DEFAULT_ORDER, design_lowpass, lowpass
from .normalize import DEFAULT_PEAK_DBFS, peak_normalize
from .smooth import smooth

__all__ = [
    "DEFAULT_CUTOFF_HZ",
    "DEFAULT_ORDER",
    "DEFAULT_PEAK_DBFS",
    "design_lowpass",
    "lowpass",
    "peak_normalize",
    "smooth",
]
