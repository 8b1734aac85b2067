"""Reference audio in any common shape, rate, sample type and scale -> mono float32 at 24 kHz, or a clear error. The
sample type decides the scale, not the values: integer samples are PCM, float ones audio whatever their peak."""

from __future__ import annotations

import logging
from math import gcd

import numpy as np
from scipy.signal import resample_poly

from ..settings import SAMPLE_RATE
from .words import FOR_PYTHON, Words

log = logging.getLogger(__name__)

MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
MAX_TRANSCRIPT_CHARS_PER_SECOND = 25  # fast speech is ~15-20 characters a second
SILENCE_RMS = 1e-4  # -80 dBFS: nothing a speaker encoder can use
MAX_CHANNELS = 8  # the short axis of a 2-D clip is its channels


def _mono(audio: np.ndarray, shape: list, who: str, words: Words) -> np.ndarray:
    """[T], [C, T], [T, C] or [B, C, T] (ComfyUI's AUDIO; B must be 1) -> [T], channels averaged."""
    if audio.ndim == 3:
        if audio.shape[0] != 1:
            raise ValueError(f"{who}: expected one clip, got a batch of {audio.shape[0]}; {words.new_clip}, "
                             "one clip only")
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


def _as_float(audio: np.ndarray, who: str) -> np.ndarray:
    """Samples as float64: integer PCM divided by its type's full scale, float audio as it is."""
    if np.issubdtype(audio.dtype, np.unsignedinteger):  # 8-bit WAV: offset binary
        half = (int(np.iinfo(audio.dtype).max) + 1) // 2
        return (audio.astype(np.float64) - half) / half
    if np.issubdtype(audio.dtype, np.signedinteger):
        return audio.astype(np.float64) / (int(np.iinfo(audio.dtype).max) + 1)
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"{who}: audio samples must be numbers, got {audio.dtype}")
    audio = audio.astype(np.float64)
    if not np.all(np.isfinite(audio)):
        raise ValueError(f"{who}: the audio contains NaN or infinite samples; re-export or re-record the clip")
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > 1.0:  # scaled at the end of prepare_reference, with resampling's overshoot
        log.info("%s: float samples peak at %.4g, above 1.0; scaled down to peak at 1.0", who, peak)
    return audio


def _samples(waveform) -> np.ndarray:
    """numpy or torch, keeping the sample type (integer or float)."""
    if hasattr(waveform, "detach"):
        tensor = waveform.detach().cpu()
        return (tensor.float() if tensor.is_floating_point() else tensor).numpy()
    return np.asarray(waveform)


def prepare_reference(waveform, sample_rate: int, who: str = "make_voice", icl: bool = False,
                      words: Words = FOR_PYTHON) -> np.ndarray:
    """Downmix, scale to [-1, 1], resample to 24 kHz, trim to 30 s and check `waveform` (numpy or torch, any shape _mono
    takes); with `icl` a longer clip is refused, as its transcript would describe audio the model never hears."""
    # scaled before the downmix, which would turn integer samples into floats
    audio = _mono(_as_float(_samples(waveform), who), list(np.shape(waveform)), who, words)
    if int(sample_rate) <= 0:
        raise ValueError(f"{who}: sample rate must be positive, got {sample_rate}")
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
                             f"works best) and transcribe that part, or {words.no_transcript} to clone from the "
                             f"first {MAX_SECONDS:.0f} s without it")
        log.warning("%s: the clip is %.1f s long; only its first %.0f s are used", who, seconds, MAX_SECONDS)
        audio = audio[: int(MAX_SECONDS * SAMPLE_RATE)]
    # qwen-tts's mel front end warns of samples past full scale, which resampling a loud clip makes
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > 1.0:
        audio = audio / peak
    if float(np.sqrt(np.mean(audio**2))) < SILENCE_RMS:
        raise ValueError(f"{who}: the clip is silent; {words.new_clip}")
    return audio.astype(np.float32)
