"""The audio a request sends and a reply takes, in OpenAI's speech API's formats (docs/serving.md, Replies). Uploads
are decoded in memory: a request never makes the server read its disk or fetch a URL."""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct

import av
import numpy as np
import soundfile as sf

from ..settings import SAMPLE_RATE

# format: (PyAV's container, its encoder); libopus is in PyAV's wheels, an FFmpeg built without it has no opus
_PYAV = {fmt: muxed for fmt, muxed in {"opus": ("ogg", "libopus"), "aac": ("adts", "aac")}.items()
         if muxed[1] in av.codecs_available}
# mp3 needs libsndfile 1.1 or later, built with LAME and mpg123; wav, pcm, flac and aac are always there
FORMATS: tuple[str, ...] = (("wav", "pcm", "flac") + (("mp3",) if "MP3" in sf.available_formats() else ())
                            + tuple(_PYAV))
STREAMABLE = ("pcm", "wav", *_PYAV)  # flac and mp3 are written whole

_MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/opus",
                "aac": "audio/aac"}
# one 20 ms Opus packet an Ogg page (the muxer's default is a second's), so a stream's audio leaves as it is encoded
_OGG_PAGE_US = 20_000
_UNKNOWN_LENGTH = 0xFFFFFFFF  # what OpenAI's streamed wav puts in its RIFF and data sizes
_SEND_AUDIO = "send a WAV, FLAC, OGG or MP3 file"
_SEND_BASE64 = "send the clip's bytes as base64 (data:audio/wav;base64,...)"

_DATA_URL = re.compile(r"data:(?P<type>[^;,]*)(?P<params>(?:;[^;,]*)*),(?P<payload>.*)", re.IGNORECASE | re.DOTALL)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# An absolute path is valid base64, so it is refused by its shape: no audio file's base64 starts with "/" and a
# letter or digit (raw MPEG starts "//" or "/+", the others with their magic). The others hold characters base64 lacks.
_PATH = re.compile(r"/[^/+]|~|\.{1,2}[/\\]|[A-Za-z]:[/\\]|\\\\")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_URLSAFE_BASE64 = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def media_type(fmt: str) -> str:
    return _MEDIA_TYPES[fmt]


def pcm16(audio: np.ndarray) -> bytes:
    """Float samples as 16-bit little-endian PCM, clipped first: past full scale a sample would wrap (a click)."""
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return np.round(clipped * 32767).astype("<i2").tobytes()


def wav_stream_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A WAV header for 16-bit mono PCM whose sizes say unknown, so a player reads until the stream ends."""
    channels, bits = 1, 16
    block_align = channels * bits // 8
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", _UNKNOWN_LENGTH, b"WAVE", b"fmt ", 16, 1, channels,
                       sample_rate, sample_rate * block_align, block_align, bits, b"data", _UNKNOWN_LENGTH)


class StreamEncoder:
    """A reply's stream in `fmt`: `feed` samples for the bytes ready (none while a frame fills), `finish` the rest."""

    def __init__(self, fmt: str):
        if fmt not in STREAMABLE:
            raise ValueError(f"response_format: {fmt!r} is written whole, not streamed; use one of "
                             f"{', '.join(STREAMABLE)}")
        self._head = wav_stream_header() if fmt == "wav" else b""
        self._muxer = None
        if fmt in _PYAV:
            container, codec = _PYAV[fmt]
            self._written = _Sink()  # a file object without seek: the muxer writes straight through, never back
            self._muxer = av.open(self._written, "w", format=container,
                                  options={"page_duration": str(_OGG_PAGE_US)} if container == "ogg" else {})
            self._stream = self._muxer.add_stream(codec, rate=SAMPLE_RATE, layout="mono")
            self._muxer.start_encoding()  # the headers, sent with the first chunk: a stream with no audio is a file
            self._pts = 0

    def feed(self, audio: np.ndarray) -> bytes:
        if self._muxer is None:
            out, self._head = self._head + pcm16(audio), b""
            return out
        if audio.size:
            # clipped to full scale, as pcm16 and mp3 are, so every format clips alike
            samples = np.clip(np.asarray(audio, np.float32), -1.0, 1.0).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
            frame.sample_rate, frame.pts = SAMPLE_RATE, self._pts
            self._pts += audio.size
            self._muxer.mux(self._stream.encode(frame))  # PyAV cuts the chunks into the encoder's frame size
        return self._take()

    def finish(self) -> bytes:
        if self._muxer is None:
            out, self._head = self._head, b""
            return out
        self._muxer.mux(self._stream.encode(None))  # the encoder's last, partly filled frame
        self._muxer.close()  # the muxer's last page
        return self._take()

    def _take(self) -> bytes:
        out = b"".join(self._written)
        self._written.clear()
        return out


class _Sink(list):
    """Where a muxer writes: a list of what it wrote, emptied by whoever sends it."""

    def write(self, data) -> int:
        self.append(bytes(data))
        return len(data)


def encode(audio: np.ndarray, fmt: str) -> bytes:
    """The whole clip (float mono at SAMPLE_RATE) as a file in `fmt`."""
    if fmt not in FORMATS:
        raise ValueError(f"response_format: {fmt!r} is not a format this server writes; "
                         f"use one of {', '.join(FORMATS)}")
    if fmt == "pcm":
        return pcm16(audio)
    if fmt in _PYAV:
        encoder = StreamEncoder(fmt)
        return encoder.feed(audio) + encoder.finish()
    buffer = io.BytesIO()
    if fmt == "mp3":
        # float, clipped: the MP3 encoder takes float samples and, like PCM, wraps those past full scale
        sf.write(buffer, np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0), SAMPLE_RATE, format="MP3")
    else:
        # the same 16-bit samples as pcm16, so every format rounds and clips alike
        samples = np.frombuffer(pcm16(audio), dtype="<i2")
        sf.write(buffer, samples, SAMPLE_RATE, format=fmt.upper(), subtype="PCM_16")
    return buffer.getvalue()


def read_audio(data: bytes, field: str) -> tuple[np.ndarray, int]:
    """An uploaded clip's float32 samples (shaped as soundfile gives them: [T] or [T, C]) and its sample rate."""
    if not data:
        raise ValueError(f"{field}: the audio is empty; {_SEND_AUDIO}")
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    except sf.SoundFileError as e:
        # libsndfile's own words ("Format not recognised"), without soundfile's repr of the in-memory buffer
        reason = getattr(e, "error_string", None) or str(e)
        raise ValueError(f"{field}: could not read the audio ({reason}); {_SEND_AUDIO}") from e
    return samples, int(rate)


def decode_base64_audio(value: str, field: str) -> bytes:
    """A clip's bytes from a data URL or bare base64 (standard or urlsafe); ValueError for anything else."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field}: no audio given; {_SEND_BASE64}")
    value = value.strip()
    match = _DATA_URL.fullmatch(value)
    if match:
        media = match["type"].strip().lower()
        if not (media.startswith("audio/") or media == "application/octet-stream"):
            raise ValueError(f"{field}: a data URL of type {media or 'text/plain'!r} is not audio; {_SEND_BASE64}")
        if match["params"].lower().split(";")[-1].strip() != "base64":
            raise ValueError(f"{field}: the data URL is not base64-encoded; {_SEND_BASE64}")
        payload = match["payload"]
    elif _URL.match(value):
        raise ValueError(f"{field}: the server does not fetch URLs; {_SEND_BASE64}")
    elif _PATH.match(value):
        raise ValueError(f"{field}: {value[:80]!r} looks like a file path, and the server never reads its own disk "
                         f"for a request; {_SEND_BASE64}")
    else:
        payload = value
    data = _b64decode("".join(payload.split()))  # MIME base64 wraps its lines
    if data is None:
        raise ValueError(f"{field}: not base64 or a data URL; {_SEND_BASE64}")
    if not data:
        raise ValueError(f"{field}: the audio is empty; {_SEND_BASE64}")
    return data


def _b64decode(text: str) -> bytes | None:
    """Standard or urlsafe base64 with or without its padding; None if `text` is neither."""
    if _BASE64.fullmatch(text):
        altchars = None
    elif _URLSAFE_BASE64.fullmatch(text):
        altchars = b"-_"
    else:
        return None
    text = text.rstrip("=")
    if len(text) % 4 == 1:  # no whole byte: a truncated or mistyped string
        return None
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=altchars, validate=True)
    except binascii.Error:
        return None
