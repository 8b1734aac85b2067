"""The speech server over real HTTP (morph/serve/; tiny model, CPU): the official `openai` client's streamed speech,
curl, whole files and server-sent events give the audio the Python API gives with the same seed; every format, whole
and streamed, decodes to the audio's length, and `speed` stretches it; saved voices are made, listed, used, deleted
and kept across a restart, and of two uploads of one name one is saved and the other refused; every bad input gets a
4xx naming its field; a client that goes away frees its row; the API key guards every route but /health; the model
is listed and retrieved."""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import io
import json
import subprocess
import threading
import time

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from morph.lines.voice import load_voice
from morph.render import BatchTTS, Line
from morph.serve.app import create_app
from morph.serve.audio_io import FORMATS, STREAMABLE, media_type
from morph.settings import GenerationSettings
from tests.audio_compare import assert_audio_close
from tests.conftest import two_second_clip
from tests.test_light_imports import heavy, loaded_after
from tests.serve_faults import hold, load_tiny

from .conftest import API_KEY, serving

SR = 24000
FRAMES = 20
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEXT = "The quick brown fox jumps over the lazy dog."


def wav_bytes(wave, rate=SR) -> bytes:
    out = io.BytesIO()
    sf.write(out, wave, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def from_pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767


def python_api(tts, voice, seed=11, frames=FRAMES) -> np.ndarray:
    """The same request through the Python API: one line in the continuous batch, with the seed."""
    settings = GenerationSettings(seed=seed, max_new_tokens=frames)
    return BatchTTS(tts).render([Line(TEXT, voice, "Auto")], settings, batch_size=1)[0]


def test_the_http_process_imports_no_torch():
    """The HTTP process parses, encodes and streams; the model, torch and the engine live in the engine's process
    alone (morph/engine/process.py), and a voice there is its file's bytes."""
    modules = loaded_after("import cli, cli_serve, uvicorn\nfrom morph.serve.app import create_app\n"
                           "from morph.serve.lifecycle import run_server")
    assert "morph.serve.app" in modules and "morph.engine.process" in modules
    assert heavy(modules) == [] and not [m for m in modules if m in ("morph.engine.engine", "morph.engine.thread")]


def save_alice(url: str) -> dict:
    """A voice saved through the API (ICL: a clip and its transcript)."""
    reply = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "alice", "ref_text": "A short line."},
                       files={"audio_sample": ("alice.wav", wav_bytes(two_second_clip()[0]), "audio/wav")}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.fixture(scope="module")
def shared(tiny_tts, tmp_path_factory):
    """One server, with alice saved, for this file's tests that leave it as they found it: each request ends before
    its test does, and none saves or deletes a voice. A server takes about 8 s to start here."""
    with serving(tiny_tts, tmp_path_factory.mktemp("voices")) as (url, app):
        save_alice(url)
        yield url, app


def test_streams_from_the_openai_client_curl_and_sse_are_the_python_apis_audio(shared, lean, tmp_path):
    url, app = shared
    want = python_api(lean, load_voice(app.state.speech.voices.path_of("alice")))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY)
    with client.audio.speech.with_streaming_response.create(
            model="qwen3-tts", voice="alice", input=TEXT, response_format="pcm",
            extra_body={"seed": 11, "max_new_tokens": FRAMES}) as reply:
        assert reply.headers["content-type"] == "audio/pcm"
        pieces = list(reply.iter_bytes())
    assert_audio_close(from_pcm(b"".join(pieces)), want, rel=1e-3)

    body = json.dumps({"input": TEXT, "voice": "alice", "response_format": "wav", "seed": 11,
                       "max_new_tokens": FRAMES})
    out = tmp_path / "curl.wav"
    curl = subprocess.run(["curl", "-sS", "--fail", "-N", "-o", str(out), f"{url}/v1/audio/speech", "-H",
                           f"Authorization: Bearer {API_KEY}", "-H", "Content-Type: application/json", "-d", body],
                          capture_output=True, text=True, timeout=120)
    assert curl.returncode == 0, curl.stderr
    streamed_wav = out.read_bytes()
    assert streamed_wav[:4] == b"RIFF" and streamed_wav[40:44] == b"\xff\xff\xff\xff"  # length unknown: streamed
    assert_audio_close(from_pcm(streamed_wav[44:]), want, rel=1e-3)

    events = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60, json={
        "input": TEXT, "voice": "alice", "stream_format": "sse", "seed": 11, "max_new_tokens": FRAMES})
    lines = [json.loads(x.removeprefix("data: ")) for x in events.text.split("\n\n") if x.strip()]
    assert [e["type"] for e in lines[-1:]] == ["speech.audio.done"] and lines[-1]["usage"]["output_tokens"] > 0
    audio = b"".join(base64.b64decode(e["audio"]) for e in lines[:-1])
    assert_audio_close(from_pcm(audio), want, rel=1e-3)


def test_whole_files_are_the_streams_audio(shared, lean):
    url, app = shared
    want = python_api(lean, load_voice(app.state.speech.voices.path_of("alice")))
    for fmt, stream in (("wav", False), ("flac", None)):
        reply = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60, json={
            "input": TEXT, "voice": "alice", "response_format": fmt, "stream": stream, "seed": 11,
            "max_new_tokens": FRAMES})
        assert reply.status_code == 200, reply.text
        assert "content-length" in reply.headers  # one whole file, not a stream
        got, rate = sf.read(io.BytesIO(reply.content), dtype="float32")
        assert rate == SR
        assert_audio_close(got, want, rel=1e-3)


def seconds_of(data: bytes, fmt: str) -> float:
    """A reply's length as a player decodes it (FFmpeg, through PyAV; pcm has no header to read)."""
    if fmt == "pcm":
        return len(data) / 2 / SR
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return sum(f.samples for f in frames) / frames[0].sample_rate


def test_every_format_whole_and_streamed_decodes_to_the_audios_length(shared):
    url, _ = shared
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY)

    def speak(fmt: str, **more) -> tuple[dict, bytes]:
        with client.audio.speech.with_streaming_response.create(
                model="qwen3-tts", voice="alice", input=TEXT, response_format=fmt,
                extra_body={"seed": 11, "max_new_tokens": FRAMES, **more}) as reply:
            return reply.headers, b"".join(reply.iter_bytes())

    seconds = seconds_of(speak("pcm")[1], "pcm")
    assert seconds > 0.5
    assert {"opus", "aac"} <= set(STREAMABLE)
    for fmt in FORMATS:
        for stream in (True, False):
            headers, data = speak(fmt, stream=stream)
            assert headers["content-type"] == media_type(fmt)
            assert ("content-length" in headers) == (not stream or fmt not in STREAMABLE), (fmt, stream)
            # the lossy codecs' delay and last frame: AAC's priming, which ADTS cannot mark, is 43 ms
            assert abs(seconds_of(data, fmt) - seconds) < 0.1, (fmt, stream)
    assert speak("opus")[1][:4] == b"OggS" and speak("aac")[1][:2] in (b"\xff\xf1", b"\xff\xf9")  # ADTS sync word


def test_speed_stretches_every_reply_to_1_over_speed_as_long(shared):
    """Streamed pcm and opus, a whole wav and server-sent events at 0.5 and 2.0 (the stretch itself, its pitch and
    its chunks: test_tempo.py); the usage counts the frames the model spoke, whatever the speed."""
    url, _ = shared
    body = {"input": TEXT, "voice": "alice", "seed": 11, "max_new_tokens": FRAMES}
    spoken = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60, json={**body, "response_format": "pcm"})
    seconds = seconds_of(spoken.content, "pcm")
    for speed in (0.5, 2.0):
        for fmt, stream in (("pcm", True), ("opus", True), ("wav", False)):
            reply = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                               json={**body, "response_format": fmt, "stream": stream, "speed": speed})
            assert reply.status_code == 200, reply.text
            assert abs(seconds_of(reply.content, fmt) / (seconds / speed) - 1) < 0.05, (speed, fmt)
        events = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                            json={**body, "stream_format": "sse", "speed": speed})
        lines = [json.loads(x.removeprefix("data: ")) for x in events.text.split("\n\n") if x.strip()]
        audio = b"".join(base64.b64decode(e["audio"]) for e in lines[:-1])
        assert abs(seconds_of(audio, "pcm") / (seconds / speed) - 1) < 0.05
        assert lines[-1]["usage"]["output_tokens"] == round(seconds * 12.5)


def test_ref_audio_clones_on_first_use(shared, ref_audio, lean):
    url, _ = shared
    clip = "data:audio/wav;base64," + base64.b64encode(wav_bytes(ref_audio[0])).decode()
    body = {"input": TEXT, "ref_audio": clip, "ref_text": "A short line.", "response_format": "pcm", "seed": 11,
            "max_new_tokens": FRAMES}
    first = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60)
    again = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60)
    assert first.status_code == 200 and again.status_code == 200 and len(first.content) > 0
    # the same clip, voice and seed; the batch has moved on, so its rows sit in other cache slots: equal to rounding
    assert_audio_close(from_pcm(again.content), from_pcm(first.content), rel=1e-3)


def test_saved_voices_are_listed_deleted_and_kept_across_a_restart(lean, tmp_path, ref_audio):
    folder = tmp_path / "voices"
    with serving(lean, folder) as (url, _):
        made = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "bob"},
                          files={"audio_sample": ("b.wav", wav_bytes(ref_audio[0]), "audio/wav")}, timeout=60)
        assert made.status_code == 200 and made.json()["mode"] == "xvector"
        again = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "bob"},
                           files={"audio_sample": ("b.wav", wav_bytes(ref_audio[0]), "audio/wav")}, timeout=60)
        assert again.status_code == 409 and again.json()["error"]["param"] == "name"
    with serving(lean, folder) as (url, _):  # a restart: the folder is all it keeps
        listed = httpx.get(f"{url}/v1/audio/voices", headers=AUTH).json()["data"]
        assert [v["id"] for v in listed] == ["bob"]
        spoken = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60, json={
            "input": TEXT, "voice": "bob", "response_format": "pcm", "max_new_tokens": 8})
        assert spoken.status_code == 200 and len(spoken.content) > 0
        assert httpx.delete(f"{url}/v1/audio/voices/bob", headers=AUTH).json()["deleted"] is True
        assert httpx.delete(f"{url}/v1/audio/voices/bob", headers=AUTH).status_code == 404
        assert httpx.get(f"{url}/v1/audio/voices", headers=AUTH).json()["data"] == []


def test_two_uploads_of_one_new_name_save_one_and_refuse_the_other(server, tmp_path, ref_audio):
    """Sent at once while the engine is held, so that neither voice can be made yet: one upload is refused with 409
    at once, the other gets 200 once its voice is made, and the voice saved is that one's (its transcript), never
    replaced by the other's."""
    url, app = server
    engine, gate = app.state.speech.engine, tmp_path / "go"
    held = engine.call(hold, str(gate))
    clip = wav_bytes(ref_audio[0])

    def upload(text: str) -> httpx.Response:
        return httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "dana", "ref_text": text},
                          files={"audio_sample": ("d.wav", clip, "audio/wav")}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        uploads = [pool.submit(upload, text) for text in ("The first take.", "The second take.")]
        try:
            first, _ = concurrent.futures.wait(uploads, 30, concurrent.futures.FIRST_COMPLETED)
            assert first, "neither upload was answered while the engine was held"
            refused = first.pop().result()
        finally:
            gate.touch()
        held.result(60)
        made = next(u.result(60) for u in uploads if u.result(60) is not refused)
    assert refused.status_code == 409, refused.text
    assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == ("name", "voice_exists")
    assert made.status_code == 200, made.text
    listed = httpx.get(f"{url}/v1/audio/voices", headers=AUTH).json()["data"]
    assert [(v["id"], v["ref_text"]) for v in listed] == [("dana", made.json()["ref_text"])]
    assert upload("A third take.").status_code == 409  # the name is its file's now
    assert httpx.get(f"{url}/v1/audio/voices", headers=AUTH).json()["data"] == listed


BAD = [  # (body changes, multipart or not, status, param, words in the message)
    ({"input": "   "}, 400, "input", "empty"),
    ({"input": "x" * 4097}, 400, "input", "4096"),
    ({"voice": "nobody"}, 400, "voice", "no saved voice named 'nobody' (saved: alice); use one of those"),
    ({"voice": "../../etc/passwd"}, 400, "voice", "not a voice name"),
    ({"voice": None}, 400, "voice", "ref_audio"),
    ({"ref_audio": "https://example.com/a.wav"}, 400, "ref_audio", "ref_audio"),
    ({"ref_audio": base64.b64encode(wav_bytes(np.zeros(SR, np.float32))).decode()}, 400, "ref_audio", "ref_audio"),
    ({"response_format": "vorbis"}, 400, "response_format", "cannot be encoded"),
    ({"speed": 4.5}, 400, "speed", "less than or equal to 4"),
    ({"speed": 0.2}, 400, "speed", "greater than or equal to 0.25"),
    ({"speed": True}, 400, "speed", "Input should be a valid number, not true"),
    ({"max_new_tokens": "4"}, 400, "max_new_tokens", 'Input should be a valid integer, not "4"'),
    ({"stream": "false"}, 400, "stream", 'Input should be a valid boolean, not "false"'),
    ({"task_type": "VoiceDesign"}, 400, "task_type", "cannot do VoiceDesign"),
    ({"task_type": "Singing"}, 400, "task_type", "not a task"),
    ({"language": "Klingon"}, 400, "language", "Klingon"),
    ({"temperature": 0}, 400, "temperature", "greater than 0"),
    ({"top_p": 2}, 400, "top_p", "less than or equal to 1"),
    ({"seq_groups": 99}, 400, "seq_groups", "15"),
    ({"max_new_tokens": 401}, 400, "max_new_tokens", "at most 400"),
    ({"stream_format": "sse", "response_format": "wav"}, 400, "response_format", "sse"),
    ({"instructions": "Speak softly."}, 400, "instructions", "takes no instructions"),
    ({"ref_text": "What the clip says."}, 400, "ref_text", "goes with ref_audio"),
]


@pytest.mark.parametrize("change,status,param,words", BAD, ids=[str(b[0])[:40] for b in BAD])
def test_bad_input_gets_a_4xx_that_names_its_field(shared, change, status, param, words):
    url, _ = shared
    body = {"model": "qwen3-tts", "input": TEXT, "voice": "alice", "response_format": "pcm", **change}
    reply = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_bad_voice_uploads_name_their_field(shared):
    url, _ = shared
    bad_name = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "a/b"},
                          files={"audio_sample": ("a.wav", b"RIFF", "audio/wav")})
    assert bad_name.status_code == 400 and bad_name.json()["error"]["param"] == "name"
    not_audio = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "ok"},
                           files={"audio_sample": ("a.wav", b"not audio at all", "audio/wav")})
    assert not_audio.status_code == 400 and not_audio.json()["error"]["param"] == "audio_sample"
    missing = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "ok"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "audio_sample"


def test_a_client_that_goes_away_frees_its_row(server):
    url, app = server
    save_alice(url)
    engine = app.state.speech.engine
    body = {"input": TEXT * 3, "voice": "alice", "response_format": "pcm", "max_new_tokens": 400}
    with httpx.stream("POST", f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60) as reply:
        next(reply.iter_raw())  # its first audio: the row is in the batch
        assert engine.stats()["rows_in_batch"] == 1
    deadline = time.monotonic() + 30
    while engine.stats()["rows_in_batch"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["rows_in_batch"] == 0
    metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert 'morph_requests_total{status="cancelled"} 1' in metrics


def test_the_api_key_guards_every_route_but_health(shared):
    url, _ = shared
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/audio/voices"), ("GET", "/metrics"),
                         ("POST", "/v1/audio/speech"), ("DELETE", "/v1/audio/voices/x")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            reply = httpx.request(method, f"{url}{path}", headers=headers)
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key", (path, headers)
            assert reply.headers["www-authenticate"] == "Bearer"  # the scheme a 401 must name (RFC 9110)
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["task_type"] == "base"
    assert "morph_requests_total" in httpx.get(f"{url}/metrics", headers=AUTH).text


def test_the_served_model_is_listed_and_retrieved_and_no_other(shared):
    url, _ = shared
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY)
    listed = client.models.list().data
    assert len(listed) == 1
    model = client.models.retrieve(listed[0].id)
    assert (model.id, model.object, model.owned_by) == (listed[0].id, "model", "qwen3-tts-morph")
    assert model.created == listed[0].created > 1.7e9  # the server's start, the same on every call
    for other in ("gpt-4o-mini-tts", f"{model.id}/more"):  # a name holding "/" is a model id too, not another route
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve(other)
        error = e.value.body
        assert (error["code"], error["type"], error["param"]) == ("model_not_found", "invalid_request_error", None)
        assert repr(other) in error["message"] and repr(model.id) in error["message"]
    assert httpx.get(f"{url}/v1/models/{model.id}").status_code == 401  # the key guards it too


def test_health_is_503_until_the_engine_is_warm(lean, tmp_path, monkeypatch):
    """Until its warm-up request has run, the server says it is loading; then it is ready."""
    from fastapi.testclient import TestClient

    import morph.serve.app as app_module

    gate, warm = threading.Event(), app_module._warm_up
    monkeypatch.setattr(app_module, "_warm_up", lambda *args: (gate.wait(60), warm(*args)))
    load = functools.partial(load_tiny, str(lean.source))
    with TestClient(create_app(load, tmp_path, width=1, max_frames=32, max_prompt=400)) as client:
        loading = client.get("/health")
        gate.set()
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loading.status_code == 503 and loading.json() == {"status": "loading"}
        assert client.get("/health").json() == {"status": "ok"}



def test_a_full_queue_answers_503_with_retry_after(lean, tmp_path, ref_audio):
    """While the engine's thread is held (a call that waits for a file), requests queue up to max_waiting rows; the next one gets
    503 with Retry-After instead of a place in an unbounded queue, and the queued ones still finish whole."""
    with serving(lean, tmp_path / "voices", max_waiting=2) as (url, app):
        made = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "carol"},
                          files={"audio_sample": ("c.wav", wav_bytes(ref_audio[0]), "audio/wav")}, timeout=60)
        assert made.status_code == 200
        engine, gate = app.state.speech.engine, tmp_path / "go"
        held = engine.call(hold, str(gate))
        body = {"input": TEXT, "voice": "carol", "response_format": "pcm", "max_new_tokens": 8}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            queued = [pool.submit(httpx.post, f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60)
                      for _ in range(2)]
            deadline = time.monotonic() + 30
            while engine.stats()["rows_waiting"] < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            refused = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60)
            gate.touch()
            replies = [q.result(60) for q in queued]
        held.result(60)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "server_busy"
        assert all(r.status_code == 200 and len(r.content) > 0 for r in replies)
        assert 'morph_requests_total{status="busy"} 1' in httpx.get(f"{url}/metrics", headers=AUTH).text
