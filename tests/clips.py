"""Reference clips as a new user's files are: integer and float WAV, FLAC, OGG and MP3, at common rates, mono
and stereo, at full scale and above it. Written in code (numpy + soundfile), so no test reads a shared file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf


def voiced(seconds: float, rate: int, peak: float) -> np.ndarray:
    """A buzzy vowel (a 140 Hz pulse train with a slow tremolo) scaled to `peak`: its sharp edges make
    resampling overshoot full scale, as espeak-ng's output does."""
    t = np.arange(int(seconds * rate)) / rate
    wave = np.sign(np.sin(2 * np.pi * 140 * t)) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return (peak * wave / np.abs(wave).max()).astype(np.float32)


# name: (file name, rate, channels, peak, soundfile subtype or None for the format's default)
CLIPS = {
    "espeak-like int16 WAV, 22.05 kHz, peak 0.9986": ("me_raw.wav", 22050, 1, 0.9986, "PCM_16"),
    "int16 WAV, 48 kHz stereo": ("stereo48k.wav", 48000, 2, 0.99, "PCM_16"),
    "int24 WAV, 16 kHz": ("int24.wav", 16000, 1, 0.9, "PCM_24"),
    "float32 WAV, 44.1 kHz, peak 1.2": ("loud_float.wav", 44100, 1, 1.2, "FLOAT"),
    "FLAC, 44.1 kHz": ("clip.flac", 44100, 1, 0.999, None),
    "OGG Vorbis, 48 kHz stereo": ("clip.ogg", 48000, 2, 0.98, None),
    "MP3, 44.1 kHz": ("clip.mp3", 44100, 1, 0.98, None),
}


def mp3_writable() -> bool:
    return "MP3" in sf.available_formats()  # libsndfile 1.1 and later


def write_clip(name: str, folder: Path, seconds: float = 1.5) -> Path:
    file, rate, channels, peak, subtype = CLIPS[name]
    wave = voiced(seconds, rate, peak)
    data = np.stack([wave, 0.7 * wave], axis=1) if channels == 2 else wave  # soundfile's [T, C]
    path = Path(folder) / file
    sf.write(path, data, rate, subtype=subtype)
    return path


def clip_names() -> list[str]:
    """Every clip this machine's libsndfile can write (MP3 needs libsndfile 1.1)."""
    return [name for name in CLIPS if not name.startswith("MP3") or mp3_writable()]
