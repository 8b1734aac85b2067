"""The server's audio formats: each reply format read back, the streamed wav header parsed by hand, and uploads
decoded from bytes or base64 with URLs and file paths refused unread."""

import base64
import io
import struct

import numpy as np
import pytest
import soundfile as sf

from morph.serve import audio_io
from morph.serve.audio_io import (
    FORMATS, SAMPLE_RATE, STREAMABLE, decode_base64_audio, encode, media_type, pcm16, read_audio, wav_stream_header,
)


def tone(seconds=0.5, peak=0.8):
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (peak * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def wav_bytes(audio, rate=SAMPLE_RATE):
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def test_formats_and_media_types():
    assert FORMATS[:3] == ("wav", "pcm", "flac") and set(FORMATS) <= {"wav", "pcm", "flac", "mp3"}
    assert ("mp3" in FORMATS) == ("MP3" in sf.available_formats())
    assert STREAMABLE == ("pcm", "wav") and SAMPLE_RATE == 24000
    assert [media_type(f) for f in ("wav", "pcm", "flac", "mp3")] == ["audio/wav", "audio/pcm", "audio/flac",
                                                                        "audio/mpeg"]


def test_pcm16_rounds_to_nearest_and_clips():
    samples = np.frombuffer(pcm16(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.7, -3.0, 0.4 / 32767, 0.6 / 32767],
                                           dtype=np.float32)), dtype="<i2")
    assert samples.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767, 0, 1]
    audio = tone()
    back = np.frombuffer(pcm16(audio), dtype="<i2") / 32767
    assert len(pcm16(audio)) == 2 * audio.size and np.max(np.abs(back - audio)) <= 0.5 / 32767 + 1e-7


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_reads_back(fmt):
    audio = tone()
    data = encode(audio, fmt)
    if fmt == "pcm":
        assert data == pcm16(audio)
        return
    back, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == SAMPLE_RATE
    if fmt == "mp3":  # lossy, with encoder delay and padding: the right length within a few frames, as loud
        assert sf.info(io.BytesIO(data)).format == "MP3" and abs(back.size - audio.size) < 0.1 * SAMPLE_RATE
        assert abs(np.sqrt(np.mean(back**2)) / np.sqrt(np.mean(audio**2)) - 1) < 0.2
    else:
        assert sf.info(io.BytesIO(data)).subtype == "PCM_16" and back.size == audio.size
        assert np.max(np.abs(back * 32768 / 32767 - audio)) <= 1 / 32767


def test_encode_clips_instead_of_wrapping():
    loud = np.array([1.5, -2.0, 0.25] * 100, dtype=np.float32)
    back, _ = sf.read(io.BytesIO(encode(loud, "wav")), dtype="int16")
    assert back[:3].tolist() == [32767, -32767, 8192]


def test_encode_refuses_other_formats():
    with pytest.raises(ValueError, match=r"response_format: 'opus' .*use one of wav, pcm, flac"):
        encode(tone(), "opus")


def test_wav_stream_header_has_unknown_length():
    audio = tone(0.1)
    stream = wav_stream_header() + pcm16(audio)
    riff, riff_size, wave = struct.unpack_from("<4sI4s", stream, 0)
    assert (riff, riff_size, wave) == (b"RIFF", 0xFFFFFFFF, b"WAVE")
    fmt_id, fmt_size, tag, channels, rate, byte_rate, block_align, bits = struct.unpack_from("<4sIHHIIHH", stream, 12)
    assert (fmt_id, fmt_size, tag, channels, rate, byte_rate, block_align, bits) == (
        b"fmt ", 16, 1, 1, 24000, 48000, 2, 16)
    assert struct.unpack_from("<4sI", stream, 36) == (b"data", 0xFFFFFFFF)
    assert len(wav_stream_header()) == 44 and stream[44:] == pcm16(audio)
    assert struct.unpack_from("<II", wav_stream_header(16000), 24) == (16000, 32000)


def test_read_audio_decodes_wav():
    stereo = np.stack([tone(), -tone()], axis=1)
    samples, rate = read_audio(wav_bytes(stereo, 16000), "audio_sample")
    assert rate == 16000 and samples.dtype == np.float32 and samples.shape == stereo.shape
    assert np.max(np.abs(samples - stereo)) < 1e-4
    mono, _ = read_audio(wav_bytes(tone()), "audio_sample")
    assert mono.shape == (tone().size,)


def test_read_audio_refuses_garbage_and_empty():
    with pytest.raises(ValueError, match=r"audio_sample: could not read the audio \(.+\); send a WAV, FLAC, OGG"):
        read_audio(b"this is not audio at all" * 10, "audio_sample")
    with pytest.raises(ValueError, match=r"ref_audio: the audio is empty; send a WAV"):
        read_audio(b"", "ref_audio")


def test_decode_data_url_and_bare_base64():
    data = wav_bytes(tone(0.05))
    b64 = base64.b64encode(data).decode()
    for value in (f"data:audio/wav;base64,{b64}", f"DATA:audio/x-wav;codecs=1;BASE64,{b64}",
                  f"data:application/octet-stream;base64,{b64}", b64, f"  {b64[:60]}\n{b64[60:]}\n"):
        assert decode_base64_audio(value, "ref_audio") == data


def test_decode_urlsafe_without_padding():
    data = bytes([0xFB, 0xEF, 0xFF, 0xFE, 0x00])  # '-' and '_' in urlsafe base64, and one '=' of padding
    text = base64.urlsafe_b64encode(data).decode()
    assert "=" in text and ("-" in text or "_" in text)
    assert decode_base64_audio(text.rstrip("="), "ref_audio") == data
    assert decode_base64_audio(base64.b64encode(data).decode().rstrip("="), "ref_audio") == data


def test_decode_accepts_raw_mpeg_frames():
    """An mp3 without an ID3 tag starts 0xFF 0xFB, "//s" in base64: not mistaken for a path."""
    if "mp3" not in FORMATS:
        pytest.skip("this libsndfile writes no mp3")
    data = encode(tone(), "mp3")
    text = base64.b64encode(data).decode()
    assert text.startswith("//")
    assert decode_base64_audio(text, "ref_audio") == data


@pytest.mark.parametrize("value, match", [
    ("https://example.com/voice.wav", "does not fetch URLs"),
    ("file:///etc/hostname", "does not fetch URLs"),
    ("/etc/hostname", "looks like a file path"),
    ("/etc/passwd", "looks like a file path"),  # all base64 characters: would decode to 8 bytes
    ("~/voice.wav", "looks like a file path"),
    ("../voice.wav", "looks like a file path"),
    ("C:\\voices\\me.wav", "looks like a file path"),
    ("voice.wav", "not base64 or a data URL"),
    ("AAAAA", "not base64 or a data URL"),  # no whole byte
    ("ab+c_d==", "not base64 or a data URL"),  # the two alphabets mixed
    ("data:text/plain;base64,AAAA", "a data URL of type 'text/plain' is not audio"),
    ("data:audio/wav,RIFF", "data URL is not base64-encoded"),
    ("data:audio/wav;base64,@@@@", "not base64 or a data URL"),
    ("data:audio/wav;base64,", "the audio is empty"),
    ("", "no audio given"),
    ("   ", "no audio given"),
])
def test_decode_refusals_name_the_field_and_the_fix(value, match):
    with pytest.raises(ValueError, match=rf"ref_audio: .*{match}.*send the clip's bytes as base64"):
        decode_base64_audio(value, "ref_audio")


def test_a_path_that_exists_is_never_read(monkeypatch, tmp_path):
    clip = tmp_path / "clip"
    clip.write_bytes(wav_bytes(tone(0.05)))

    def no_reading(*args, **kwargs):
        raise AssertionError("decode_base64_audio opened a file")

    monkeypatch.setattr("builtins.open", no_reading)
    monkeypatch.setattr(audio_io.io, "open", no_reading)
    for path in (str(clip), "/etc/hostname"):
        with pytest.raises(ValueError, match="looks like a file path"):
            decode_base64_audio(path, "ref_audio")


def test_read_audio_says_libsndfiles_own_words():
    with pytest.raises(ValueError) as e:
        read_audio(b"this is not audio at all" * 10, "audio_sample")
    assert str(e.value) == ("audio_sample: could not read the audio (Format not recognised.); send a WAV, FLAC, OGG "
                            "or MP3 file")


@pytest.mark.skipif("mp3" not in FORMATS, reason="libsndfile without MP3")
def test_mp3_clips_past_full_scale_rather_than_wrapping():
    loud = tone(peak=1.6)  # a third of each half-wave past full scale
    back, _ = sf.read(io.BytesIO(encode(loud, "mp3")), dtype="float32")
    clipped = np.clip(loud, -1, 1)
    n = min(back.size, clipped.size)
    lag = int(np.argmax(np.correlate(back[:4000], clipped[:2000], mode="valid")))  # the encoder's delay
    assert np.max(np.abs(back)) < 1.2
    assert np.corrcoef(back[lag:lag + n - 4000], clipped[:n - 4000])[0, 1] > 0.95


def test_base64_refusals_name_what_they_saw():
    with pytest.raises(ValueError, match="a data URL of type 'text/plain' is not audio"):
        decode_base64_audio("data:;base64,AAAA", "ref_audio")  # no media type: text/plain, as RFC 2397 says
    path = "/" + "a" * 100
    with pytest.raises(ValueError) as e:
        decode_base64_audio(path, "ref_audio")
    assert f"ref_audio: {path[:80]!r} looks like a file path" in str(e.value)
