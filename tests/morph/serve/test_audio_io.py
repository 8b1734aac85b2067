"""The server's audio formats: each reply format read back, whole and streamed chunk by chunk (opus and aac decoded by
PyAV), the streamed wav header parsed by hand, and uploads decoded from bytes or base64 with URLs and file paths
refused unread."""

import base64
import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf

from morph.serve import audio_io
from morph.serve.audio_io import (
    FORMATS, SAMPLE_RATE, STREAMABLE, StreamEncoder, decode_base64_audio, encode, media_type, pcm16, read_audio,
    wav_stream_header,
)


def tone(seconds=0.5, peak=0.8):
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (peak * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def wav_bytes(audio, rate=SAMPLE_RATE):
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def pyav_decoded(data: bytes) -> tuple[np.ndarray, int]:
    """An opus or aac file's samples as FFmpeg decodes them (opus at 48 kHz, whatever rate it was made at)."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]), frames[0].sample_rate


def test_formats_and_media_types():
    assert FORMATS[:3] == ("wav", "pcm", "flac") and FORMATS[-2:] == ("opus", "aac")  # PyAV's wheels have both
    assert ("mp3" in FORMATS) == ("MP3" in sf.available_formats())
    assert STREAMABLE == ("pcm", "wav", "opus", "aac") and SAMPLE_RATE == 24000
    assert [media_type(f) for f in ("wav", "pcm", "flac", "mp3", "opus", "aac")] == [
        "audio/wav", "audio/pcm", "audio/flac", "audio/mpeg", "audio/opus", "audio/aac"]


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
    if fmt in ("opus", "aac"):
        back, rate = pyav_decoded(data)
        assert av.open(io.BytesIO(data)).format.name == {"opus": "ogg", "aac": "aac"}[fmt]  # Ogg; ADTS's raw AAC
        assert_lossy_copy(back, rate, audio)
        return
    back, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == SAMPLE_RATE
    if fmt == "mp3":  # lossy, with encoder delay and padding: the right length within a few frames, as loud
        assert sf.info(io.BytesIO(data)).format == "MP3" and abs(back.size - audio.size) < 0.1 * SAMPLE_RATE
        assert abs(np.sqrt(np.mean(back**2)) / np.sqrt(np.mean(audio**2)) - 1) < 0.2
    else:
        assert sf.info(io.BytesIO(data)).subtype == "PCM_16" and back.size == audio.size
        assert np.max(np.abs(back * 32768 / 32767 - audio)) <= 1 / 32767


def assert_lossy_copy(back: np.ndarray, rate: int, audio: np.ndarray) -> None:
    """A lossy codec's copy of `audio`: as long within the encoder's delay and last frame (AAC's 1,024-sample
    priming, which ADTS cannot mark, and its frame: under 0.1 s), as loud, and the same tone."""
    assert abs(back.size / rate - audio.size / SAMPLE_RATE) < 0.1
    assert abs(np.sqrt(np.mean(back**2)) / np.sqrt(np.mean(audio**2)) - 1) < 0.2
    peak = np.argmax(np.abs(np.fft.rfft(back))) * rate / back.size
    assert abs(peak - 220) < 5


@pytest.mark.parametrize("fmt", STREAMABLE)
def test_a_stream_encoded_chunk_by_chunk_decodes_to_its_audio(fmt):
    """Uneven chunks as the engine hands them out, through one encoder: the bytes read back as one file of the whole
    audio; opus and aac send audio before the end (a stream, not a file held back)."""
    audio = tone(1.0)
    encoder = StreamEncoder(fmt)
    cuts = [0, 1000, 1001, 5800, 13000, audio.size]
    parts = [encoder.feed(audio[a:b]) for a, b in zip(cuts, cuts[1:])] + [encoder.finish()]
    data = b"".join(parts)
    if fmt == "pcm":
        assert data == pcm16(audio)
    elif fmt == "wav":
        assert data == wav_stream_header() + pcm16(audio)
    else:
        assert sum(len(p) for p in parts[:-1]) > len(data) / 2  # most of it sent before the end
        assert_lossy_copy(*pyav_decoded(data), audio)
    empty = StreamEncoder(fmt).finish()  # no audio: wav's header, Ogg's header pages; pcm and ADTS have none
    assert empty.startswith({"wav": b"RIFF", "opus": b"OggS"}.get(fmt, b"")) and bool(empty) == (fmt in ("wav", "opus"))
    with pytest.raises(ValueError, match="written whole, not streamed"):
        StreamEncoder("flac")


def test_encode_clips_instead_of_wrapping():
    loud = np.array([1.5, -2.0, 0.25] * 100, dtype=np.float32)
    back, _ = sf.read(io.BytesIO(encode(loud, "wav")), dtype="int16")
    assert back[:3].tolist() == [32767, -32767, 8192]


def test_encode_refuses_other_formats():
    with pytest.raises(ValueError, match=r"response_format: 'vorbis' .*use one of wav, pcm, flac"):
        encode(tone(), "vorbis")


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
