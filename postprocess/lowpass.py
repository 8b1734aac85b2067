"""Butterworth low-pass that smooths synthesised speech."""

import logging
import math

import numpy as np
from scipy.signal import butter, sosfilt

from ._checks import as_audio

DEFAULT_CUTOFF_HZ = 11000.0
DEFAULT_ORDER = 2

log = logging.getLogger(__name__)


def design_lowpass(cutoff_hz: float, sample_rate: int, order: int = DEFAULT_ORDER) -> np.ndarray | None:
    """Design a Butterworth low-pass in second-order-sections form.

    Returns None (and logs why) when ``cutoff_hz`` is at or above Nyquist,
    since there is then nothing to remove. Raises ValueError for an order
    below 1, a cutoff that is not a finite positive frequency, or a
    sample rate that is not positive.
    """
    if order < 1 or int(order) != order:
        raise ValueError(f"low-pass order must be an integer >= 1, got {order}; use {DEFAULT_ORDER} (the default)")
    if not math.isfinite(cutoff_hz) or cutoff_hz <= 0:
        raise ValueError(
            f"low-pass cutoff must be a finite frequency > 0 Hz, got {cutoff_hz}; "
            f"use e.g. {DEFAULT_CUTOFF_HZ}, or a value >= Nyquist to skip filtering"
        )
    if not sample_rate > 0:
        raise ValueError(f"sample rate must be > 0 Hz, got {sample_rate}")
    nyquist = sample_rate / 2
    if cutoff_hz >= nyquist:
        log.info(
            "low-pass cutoff %g Hz is at or above Nyquist (%g Hz at %g Hz); leaving audio unfiltered",
            cutoff_hz, nyquist, sample_rate,
        )
        return None
    return butter(int(order), cutoff_hz, btype="low", fs=sample_rate, output="sos")


def lowpass(
    audio: np.ndarray,
    sample_rate: int,
    cutoff_hz: float = DEFAULT_CUTOFF_HZ,
    order: int = DEFAULT_ORDER,
) -> np.ndarray:
    """Low-pass ``audio`` ([T], [C, T] or [B, C, T]) along its last axis.

    Filtering is causal (``sosfilt``, not ``filtfilt``), so the magnitude
    response is exactly that of ``design_lowpass``. Returns float32 of the
    input's shape; the samples are unchanged when the cutoff is at or above
    Nyquist. Raises ValueError for NaN/inf samples or bad filter settings.
    """
    x = as_audio(audio)
    sos = design_lowpass(cutoff_hz, sample_rate, order)
    # sosfilt cannot reshape an empty time axis, so an empty clip is returned as is.
    if sos is None or x.shape[-1] == 0:
        return x.astype(np.float32)
    return sosfilt(sos, x, axis=-1).astype(np.float32)
