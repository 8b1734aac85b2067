"""The speech server when things go wrong (morph/serve/; real HTTP, tiny model, CPU): an engine whose CUDA context
fails answers every request at once, says so at /health while its process is started again, then serves; a batch that
fails otherwise fails its own requests only; a client that hangs up frees its rows within a chunk in every format; a
stream cut off either way is one warning in the log, never an error or a traceback; every error is OpenAI's shape; a
draining server refuses new work. The process's own end (exit codes, SIGTERM): tests/test_cli_serve.py."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import socket
import time

import httpx
import pytest

from morph.serve.audio_io import FORMATS, STREAMABLE
from tests.http_server import wait_for, wait_healthy
from tests.serve_faults import CUDA_ASSERT, SLOW_DELAY

from .conftest import API_KEY, no_errors, serving
from .test_app import AUTH, TEXT, wav_bytes

LONG = {"input": TEXT * 3, "voice": "alice", "max_new_tokens": 400}
# LONG slowed by SLOW_DELAY a frame (tests/serve_faults.py), for a test that must join rows beside it, or see a hang-up,
# before it ends: alone it ends in about 3.5 s on an idle 2-core machine, sooner than a busy one takes to send them
# (CI, stop 70)
SLOW = {**LONG, "input": "SLOW. " + TEXT * 3}


@pytest.fixture
def alice_voice(ref_audio):
    def make(url):
        reply = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "alice"},
                           files={"audio_sample": ("a.wav", wav_bytes(ref_audio[0]), "audio/wav")}, timeout=60)
        assert reply.status_code == 200, reply.text
    return make


def metric(url, name) -> float:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def requests_by_status(url) -> dict[str, int]:
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    found = re.findall(r'^morph_requests_total\{status="(\w+)"\} (\S+)$', text, re.M)
    return {status: int(float(n)) for status, n in found}


def restarts_then_serves(url: str, cause: str) -> None:
    """After the engine's process ended: /health says restarting with the cause, a new request gets 503 until another
    process is up, and that one serves the next request."""
    health = httpx.get(f"{url}/health")
    assert health.status_code == 503 and health.json()["status"] == "restarting"
    assert cause in health.json()["error"]
    refused = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json={"input": "Hi.", "voice": "alice"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_restarting"
    wait_healthy(url, 120)
    after = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                       json={"input": "Fine again.", "voice": "alice", "response_format": "pcm", "max_new_tokens": 8})
    assert after.status_code == 200 and len(after.content) > 0


def test_a_failed_cuda_context_answers_every_request_at_once(lean, tmp_path, alice_voice):
    """A device-side assert in the batch: the request that hit it and one waiting beside it get 503 naming the cause,
    a stream already under way is cut off (no clean end); the engine's process exits, /health says restarting with
    the reason and new requests get 503 until another process is up, which serves the next request."""
    with serving(lean, tmp_path / "voices", fault=dict(error=RuntimeError(CUDA_ASSERT), delay=SLOW_DELAY),
                 width=1) as (url, app):
        alice_voice(url)
        with httpx.stream("POST", f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                          json={**SLOW, "response_format": "pcm"}) as stream, \
                concurrent.futures.ThreadPoolExecutor(2) as pool:
            chunks = stream.iter_raw()
            next(chunks)  # under way: its headers and first audio are out
            failing = pool.submit(httpx.post, f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                                  json={"input": "FAIL now.", "voice": "alice", "response_format": "wav",
                                        "stream": False})
            waiting = pool.submit(httpx.post, f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                                  json={"input": "And FAIL too.", "voice": "alice", "response_format": "mp3"})
            wait_for(lambda: app.state.speech.engine.stats()["rows_waiting"] == 2)
            stream.close()  # the FAIL rows join when the stream's row leaves its one slot
            wait_for(lambda: app.state.lifecycle.state == "restarting")
            failed = time.monotonic()
            replies = failing.result(30), waiting.result(30)
        assert time.monotonic() - failed < 2  # answered when the engine failed, not at a client's timeout
        for reply in replies:
            assert reply.status_code == 503, reply.text
            error = reply.json()["error"]
            assert error["code"] == "engine_failed" and error["type"] == "server_error"
            assert "device-side assert" in error["message"]
        restarts_then_serves(url, "device-side assert")


def test_a_stream_under_way_is_cut_off_when_its_batch_fails(lean, tmp_path, alice_voice, server_log):
    """A Python error in the batch (the CUDA context lives): the requests in it fail (a stream is cut off, a whole
    file is a 500 naming the error), and the server goes on: the next request is whole and /health stays 200. The cut
    is one warning naming the error: not uvicorn's "Exception in ASGI application" and its traceback."""
    fault = dict(error=ValueError("a bug in a step"), times=1, delay=SLOW_DELAY)
    with serving(lean, tmp_path / "voices", fault=fault) as (url, _):
        alice_voice(url)
        with httpx.stream("POST", f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                          json={**SLOW, "response_format": "pcm"}) as stream:
            chunks = stream.iter_raw()
            next(chunks)
            failed = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                                json={"input": "FAIL here.", "voice": "alice", "response_format": "flac"})
            with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never ends properly
                for _ in chunks:
                    pass
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "server_error"
        assert "ValueError: a bug in a step" in failed.json()["error"]["message"]
        after = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                           json={"input": "Fine again.", "voice": "alice", "response_format": "pcm",
                                 "max_new_tokens": 8})
        assert after.status_code == 200 and len(after.content) > 0
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    no_errors(server_log)
    said = [r.getMessage() for r in server_log]
    assert len(said) == 1 and said[0].startswith("POST /v1/audio/speech: a stream was cut off after "), said
    assert said[0].endswith(" s of audio: ValueError: a bug in a step"), said


def send_raw(url: str, body: bytes, path: str = "/v1/audio/speech", length: int | None = None) -> socket.socket:
    """A POST over a socket of our own: the test can hang up before any byte of the reply, or claim a length."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer {API_KEY}"
              f"\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n".encode() + body)
    return s


def raw_request(url: str, body: dict) -> socket.socket:
    return send_raw(url, json.dumps(body).encode())


def raw_reply(s: socket.socket) -> tuple[int, dict]:
    reply = http.client.HTTPResponse(s)
    reply.begin()
    return reply.status, json.loads(reply.read())


CASES = [{"response_format": f} for f in FORMATS] + [
    {"response_format": "wav", "stream": False}, {"response_format": "pcm", "stream": False},
    {"response_format": "pcm", "stream_format": "sse"}]


def test_a_client_that_hangs_up_frees_its_rows_at_once_in_every_format(lean, tmp_path, alice_voice, server_log):
    """Whole files (mp3, flac, wav and pcm with stream false), streams (pcm, wav, opus, aac) and server-sent events:
    the client hangs up while its row renders; the row leaves the batch within a few frames, and the gauges read 0
    after; each stream cut short is one warning, and nothing is an error. The rows are SLOW ones: a LONG row could end
    on its own before a busy machine noticed the hang-up, and be counted as answered (once in a fresh-clone run of
    .ci/run on a 2-core machine)."""
    with serving(lean, tmp_path / "voices", fault=dict(delay=SLOW_DELAY)) as (url, app):
        alice_voice(url)
        engine = app.state.speech.engine
        for case in CASES:
            s = raw_request(url, {**SLOW, **case})
            wait_for(lambda: engine.stats()["rows_live"] == 1)
            time.sleep(0.2)  # mid-render
            s.close()
            hung_up = time.monotonic()
            wait_for(lambda: engine.stats()["rows_in_batch"] == 0, 10)
            assert time.monotonic() - hung_up < 1.5, case
        assert metric(url, "morph_rows_live") == 0 and metric(url, "morph_cache_slots") == 0
        # each is counted as its reply ends on the event loop, which may come after the engine's process freed its row
        wait_for(lambda: sum(requests_by_status(url).values()) == len(CASES), 5)
        assert requests_by_status(url) == {"cancelled": len(CASES)}
    no_errors(server_log)
    streams = [c for c in CASES if c.get("stream_format") == "sse" or (c["response_format"] in STREAMABLE
                                                                       and c.get("stream") is not False)]
    assert len(streams) == 5
    said = [r.getMessage() for r in server_log]
    assert len(said) == len(streams) and all(m.startswith("POST /v1/audio/speech: a stream stopped after ") and
                                             m.endswith(" s of audio, before its end: cancelled") for m in said), said


def test_every_error_is_openai_shaped(server):
    """The framework's own errors too: no route, a wrong method, a body that is not UTF-8 or not JSON, one too large
    (refused by its length, before it is read), a lone surrogate, a number that is not finite; the key's scheme is
    any case; a draining server refuses new requests but still reports."""
    url, app = server
    post = "POST", f"{url}/v1/audio/speech"
    json_headers = {**AUTH, "Content-Type": "application/json"}
    cases = [
        (httpx.get(f"{url}/v1/nothing", headers=AUTH), 404, None, "no such route"),
        (httpx.get(f"{url}/v1/audio/speech", headers=AUTH), 405, None, "send POST"),
        (httpx.request(*post, headers=json_headers, content=b'{"input": "\xff\xfe"}'), 400, None, "not UTF-8"),
        (httpx.request(*post, headers=json_headers, content=b"input=hello"), 400, None, "not valid JSON"),
        (httpx.request(*post, headers=json_headers, content=b'{"input": "a \\ud800 b", "voice": "x"}'), 400, "input",
         "lone surrogate"),
        (httpx.request(*post, headers=json_headers, content=b'{"input": "a", "voice": "x", "temperature": Infinity}'),
         400, "temperature", "finite"),
        (httpx.get(f"{url}/v1/models", headers={"Authorization": f"Basic {API_KEY}"}), 401, None, "Bearer"),
        (httpx.request(*post, headers={**AUTH, "Content-Type": "text/plain"}, content=b'{"input": "a", "voice": "x"}'),
         415, None, "the body's Content-Type is text/plain, which this route does not read; send it as JSON, with the "
                    "header Content-Type: application/json"),
        (httpx.post(f"{url}/v1/audio/voices", headers=AUTH, json={"name": "x", "audio_sample": "..."}), 415, None,
         "the body's Content-Type is application/json, which this route does not read; send it as a multipart form"),
    ]
    for reply, status, param, words in cases:
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
        assert words in error["message"], error
    for path, claimed, words in (("/v1/audio/speech", 50 << 20, "8 MiB"), ("/v1/audio/voices", 26 << 20, "25 MiB")):
        status, reply = raw_reply(send_raw(url, b'{"input": ', path, claimed))  # 50 MB said, a few bytes sent
        assert status == 413 and reply["error"]["code"] == "request_too_large" and words in reply["error"]["message"]
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"bearer {API_KEY}"}).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"BEARER  {API_KEY}"}).status_code == 200

    assert app.state.lifecycle.drain()
    health = httpx.get(f"{url}/health")
    assert health.status_code == 503 and health.json() == {"status": "draining"}
    refused = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json={"input": "Hi.", "voice": "alice"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
    assert httpx.get(f"{url}/metrics", headers=AUTH).status_code == 200
