"""Reference audio in any common shape, rate and scale -> mono float32 at 24 kHz, or a clear error."""

from __future__ import annotations

import logging
from math import gcd

import numpy as np
from scipy.signal import resample_poly

from .settings import SAMPLE_RATE

log = logging.getLogger(__name__)

MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
SILENCE_RMS = 1e-4  # -80 dBFS: nothing a speaker encoder can use
INT16_FULL_SCALE = 32768.0
MAX_CHANNELS = 8  # the short axis of a 2-D clip is its channels


def _mono(audio: np.ndarray, shape: list, who: str) -> np.ndarray:
    """[T], [C, T], [T, C] or [B, C, T] (ComfyUI's AUDIO; B must be 1) -> [T], channels averaged."""
    if audio.ndim == 3:
        if audio.shape[0] != 1:
            raise ValueError(f"{who}: expected one clip, got a batch of {audio.shape[0]}; pick one clip first")
        audio = audio[0]
    if audio.ndim == 2:
        rows, cols = audio.shape
        if rows <= MAX_CHANNELS and cols > rows:  # [C, T]: torchaudio, ComfyUI
            audio = audio.mean(axis=0)
        elif cols <= MAX_CHANNELS and rows > cols:  # [T, C]: soundfile.read, scipy.io.wavfile
            audio = audio.mean(axis=1)
        else:
            raise ValueError(f"{who}: cannot tell channels from samples in audio shaped {shape}; give it as "
                             f"[channels, samples] with at most {MAX_CHANNELS} channels")
    if audio.ndim != 1:
        raise ValueError(f"{who}: expected audio shaped [T], [C, T], [T, C] or [1, C, T], got {shape}")
    return audio


def prepare_reference(waveform, sample_rate: int, who: str = "reference audio", icl: bool = False) -> np.ndarray:
    """Downmix, rescale int16-range samples, resample to 24 kHz, trim to 30 s, and check.

    `waveform` is [T], [C, T], [T, C] or [1, C, T] (ComfyUI's AUDIO layout), numpy or torch. With `icl`
    (a transcript will be used) a clip over 30 s is refused instead of trimmed: the transcript would then
    describe audio the model never hears.
    """
    audio = np.asarray(waveform.detach().cpu().float().numpy() if hasattr(waveform, "detach") else waveform)
    audio = _mono(audio, list(np.shape(waveform)), who)
    if int(sample_rate) <= 0:
        raise ValueError(f"{who}: sample rate must be positive, got {sample_rate}")
    audio = audio.astype(np.float64)
    if not np.all(np.isfinite(audio)):
        raise ValueError(f"{who}: the audio contains NaN or infinite samples; re-export or re-record the clip")
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if 1.0 < peak <= INT16_FULL_SCALE:
        log.info("%s: samples are in int16 range (peak %.0f); rescaled to [-1, 1]", who, peak)
        audio = audio / INT16_FULL_SCALE
    elif peak > INT16_FULL_SCALE:
        raise ValueError(f"{who}: sample values up to {peak:.3g} are outside any audio range; "
                         "expected floats in [-1, 1] or int16 values")
    seconds = audio.size / float(sample_rate)
    if seconds < MIN_SECONDS:
        raise ValueError(f"{who}: the clip is {seconds:.2f} s long; give at least {MIN_SECONDS:.0f} s of speech "
                         "(3 to 10 s works best)")
    if int(sample_rate) != SAMPLE_RATE:
        g = gcd(int(sample_rate), SAMPLE_RATE)
        audio = resample_poly(audio, SAMPLE_RATE // g, int(sample_rate) // g)
    if audio.size > MAX_SECONDS * SAMPLE_RATE:
        if icl:
            raise ValueError(f"{who}: the clip is {seconds:.1f} s long, and only its first {MAX_SECONDS:.0f} s can be "
                             "used, but the transcript is for the whole clip (in-context cloning needs the words of "
                             f"exactly the audio it hears). Trim the clip to {MAX_SECONDS:.0f} s or less (3 to 10 s "
                             "works best) and transcribe that part, or clear the transcript (or turn on "
                             f"x_vector_only) to clone from the first {MAX_SECONDS:.0f} s without it")
        log.warning("%s: the clip is %.1f s long; only its first %.0f s are used", who, seconds, MAX_SECONDS)
        audio = audio[: int(MAX_SECONDS * SAMPLE_RATE)]
    if float(np.sqrt(np.mean(audio**2))) < SILENCE_RMS:
        raise ValueError(f"{who}: the clip is silent; connect a recording of the voice to clone")
    return audio.astype(np.float32)
