"""The server's engine in a process of its own (morph/engine/process.py; real HTTP, tiny model, CPU): a voice made
through it, a killed engine process answers the requests it held at once, /health says restarting until another is
up and serves the next request, and the server's shutdown stops it. Audio equal to the Python API's through the two
processes: test_app.py."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest

from tests.serve_faults import SLOW_DELAY

from .conftest import serving
from .test_app import AUTH, wav_bytes
from .test_faults import SLOW, restarts_then_serves


def test_a_killed_engine_process_answers_its_requests_and_is_started_again(lean, tmp_path, ref_audio):
    # the first row must not end before the second joins it: test_faults.py's SLOW
    with serving(lean, tmp_path / "voices", fault=dict(delay=SLOW_DELAY)) as (url, app):
        made = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "alice"}, timeout=60,
                          files={"audio_sample": ("a.wav", wav_bytes(ref_audio[0]), "audio/wav")})
        assert made.status_code == 200, made.text  # made in the engine's process, saved by the server's
        engine = app.state.speech.engine
        with httpx.stream("POST", f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                          json={**SLOW, "response_format": "pcm"}) as stream, \
                concurrent.futures.ThreadPoolExecutor(1) as pool:
            chunks = stream.iter_raw()
            next(chunks)  # under way
            whole = pool.submit(httpx.post, f"{url}/v1/audio/speech", headers=AUTH, timeout=60,
                                json={**SLOW, "response_format": "wav", "stream": False})
            deadline = time.monotonic() + 30
            while engine.stats()["rows_live"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            pid = engine.pid
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(httpx.RemoteProtocolError):  # the stream is cut off, not ended as if whole
                for _ in chunks:
                    pass
            reply = whole.result(30)
            answered = time.monotonic() - killed
        assert answered < 1
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_failed"
        assert "killed by SIGKILL" in reply.json()["error"]["message"]
        restarts_then_serves(url, "SIGKILL")
        assert engine.pid not in (None, pid)
        pid = engine.pid
    assert engine.pid is None  # the server's shutdown stopped the engine's process
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
