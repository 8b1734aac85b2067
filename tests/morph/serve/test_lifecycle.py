"""The server's state and its door (morph/serve/lifecycle.py) on a bare ASGI app, without a model: which state lets
which request in, the key in any case of its scheme (a 401 names it), the size caps (by Content-Length before reading,
and by the bytes read), the count of requests inside that a drain waits for; a port in use found before the model
loads; what the server leaves out of uvicorn's log. The same over real HTTP with the model: test_faults.py, and the
process's end: tests/test_cli_serve.py."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time

import httpx
import pytest

from morph.serve.lifecycle import MAX_JSON_BYTES, MAX_UPLOAD_BYTES, Gate, Lifecycle, quiet_uvicorn, run_server
from morph.serve.protocol import CutOff

KEY = "k"


def test_the_states_and_what_health_says():
    life = Lifecycle()
    assert life.health() == (503, {"status": "loading"}) and life.refusal() is None
    life.ready()
    assert life.health() == (200, {"status": "ok"}) and life.refusal() is None
    assert life.drain() and not life.drain()  # once
    assert life.health() == (503, {"status": "draining"})
    assert (life.refusal().status, life.refusal().code) == (503, "server_shutting_down")
    life.ready()  # a drain is not undone
    assert life.state == "draining"
    life.fail("the speech engine failed (CUDA error)")
    life.fail("a later reason")  # the first is kept
    assert life.health() == (503, {"status": "failed", "error": "the speech engine failed (CUDA error)"})
    refusal = life.refusal()
    assert (refusal.status, refusal.code, refusal.kind) == (503, "server_failed", "server_error")
    assert "the speech engine failed (CUDA error)" in refusal.message
    assert not life.drain() and life.state == "failed"


def test_a_failure_while_loading():
    life = Lifecycle()
    life.fail("the warm-up request failed: boom")
    life.ready()
    assert life.health() == (503, {"status": "failed", "error": "the warm-up request failed: boom"})


class Echo:
    """An ASGI app that answers with the body it read and how many requests the gate counted inside."""

    def __init__(self):
        self.gate = None

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:  # strictly as ASGI says: a replayed body must be a well-formed message
            message = await receive()
            assert message["type"] == "http.request"
            body += message.get("body", b"")
            more = message["more_body"] if "more_body" in message else False
            assert more in (True, False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-active", str(
            self.gate.lifecycle.active).encode())]})
        await send({"type": "http.response.body", "body": body})


def request(gate: Gate, method: str, path: str, **kw) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t") as client:
            return await client.request(method, path, **kw)
    return asyncio.run(go())


def make_gate(key: str | None) -> Gate:
    echo = Echo()
    echo.gate = Gate(echo, Lifecycle(), key)
    return echo.gate


@pytest.fixture
def gate():
    return make_gate(KEY)


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_the_key_in_any_case_of_its_scheme(gate):
    for given in ("Bearer k", "bearer k", "BEARER   k", " Bearer k "):
        assert request(gate, "GET", "/v1/models", headers={"Authorization": given}).status_code == 200, given
    for given in ("Bearer kk", "Basic k", "k", "Bearer", ""):
        reply = request(gate, "GET", "/v1/models", headers={"Authorization": given})
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key", given
        assert reply.headers["www-authenticate"] == "Bearer"
    assert request(gate, "GET", "/health").status_code == 200  # no key
    assert request(gate, "GET", "/metrics").status_code == 401
    assert request(make_gate(None), "GET", "/v1/models").status_code == 200  # a server without a key


def test_requests_are_counted_inside_and_refused_while_draining(gate):
    assert request(gate, "GET", "/v1/models", headers=AUTH).headers["x-active"] == "1"
    assert request(gate, "GET", "/metrics", headers=AUTH).headers["x-active"] == "0"  # not waited for
    assert gate.lifecycle.active == 0
    gate.lifecycle.drain()
    refused = request(gate, "POST", "/v1/audio/speech", headers=AUTH, content=b"{}")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
    assert request(gate, "GET", "/v1/models", headers=AUTH).status_code == 503
    assert request(gate, "GET", "/metrics", headers=AUTH).status_code == 200
    assert request(gate, "GET", "/health").status_code == 200  # the route itself says 503: not the gate's
    assert request(gate, "POST", "/v1/audio/speech", content=b"{}").status_code == 401  # the key first


def test_bodies_are_capped_by_their_length_and_by_what_is_read(gate):
    reply = request(gate, "POST", "/v1/audio/speech", headers=AUTH, content=b"x" * MAX_JSON_BYTES)
    assert reply.status_code == 200 and len(reply.content) == MAX_JSON_BYTES  # at the cap: whole
    over = request(gate, "POST", "/v1/audio/speech", headers=AUTH, content=b"x" * (MAX_JSON_BYTES + 1))
    assert over.status_code == 413 and over.json()["error"]["code"] == "request_too_large"
    assert over.json()["error"]["message"] == ("the request body is over this server's 8 MiB; send a shorter clip or "
                                               "text")

    async def chunks(size, step=1 << 20):  # no Content-Length: counted as read
        for start in range(0, size, step):
            yield b"x" * min(step, size - start)
    assert request(gate, "POST", "/v1/audio/speech", headers=AUTH,
                   content=chunks(MAX_JSON_BYTES + 1)).status_code == 413
    assert request(gate, "POST", "/v1/audio/speech", headers=AUTH, content=chunks(5 << 20)).content == b"x" * (5 << 20)
    upload = request(gate, "POST", "/v1/audio/voices", headers=AUTH, content=b"x" * (MAX_JSON_BYTES + 1))
    assert upload.status_code == 200  # an upload may be larger
    huge = request(gate, "POST", "/v1/audio/voices", headers=AUTH, content=b"x" * (MAX_UPLOAD_BYTES + 1))
    assert huge.status_code == 413 and "25 MiB" in huge.json()["error"]["message"]
    assert gate.lifecycle.active == 0


def test_a_failed_server_answers_503_and_closes_the_connection(gate):
    gate.lifecycle.fail("the speech engine ended 3 times")
    refused = request(gate, "POST", "/v1/audio/speech", headers=AUTH, content=b"{}")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_failed"
    assert refused.headers["connection"] == "close"  # the process exits in a moment: no keep-alive to it


def never_loads():
    raise AssertionError("the model was loaded")


def test_a_port_in_use_fails_the_start_at_once_before_the_model_loads(tmp_path, monkeypatch):
    """The port is bound before the app starts (the model's load, in the engine's process): in use, the server has
    failed in well under a second, and the process exits 1 (os._exit, caught here)."""
    from morph.serve.app import create_app

    monkeypatch.setattr(os, "_exit", sys.exit)
    app = create_app(never_loads, tmp_path, width=1, max_frames=8, max_prompt=8)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(SystemExit) as e:
            run_server(app, "127.0.0.1", port, 1)
    assert e.value.code == 1 and time.monotonic() - started < 1
    assert app.state.lifecycle.health() == (503, {"status": "failed", "error": (
        f"cannot listen on 127.0.0.1:{port} (Address already in use); stop what listens there, or choose another "
        "--host or --port")})


def test_uvicorns_log_leaves_out_what_the_server_did_on_purpose():
    """A stream the server cut off (its own warning said so) and a handshake the gate refused are no errors; every
    other record, a bug's traceback included, stays."""
    quiet_uvicorn()
    quiet_uvicorn()  # once, however many apps are made
    logger = logging.getLogger("uvicorn.error")
    assert len([f for f in logger.filters if type(f).__name__ == "_Deliberate"]) == 1

    def record(msg, error=None):
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None,
                                 (type(error), error, None) if error else None)

    def raised(cause):  # as Starlette re-raises a failure after the response started
        try:
            try:
                raise cause
            except Exception as e:
                raise RuntimeError("Caught handled exception, but response already started.") from e
        except RuntimeError as e:
            return e

    assert not logger.filter(record("ASGI callable returned without completing handshake."))
    assert not logger.filter(record("Exception in ASGI application\n", raised(CutOff(ValueError("a bug")))))
    assert logger.filter(record("Exception in ASGI application\n", raised(ValueError("a bug"))))
    assert logger.filter(record("ASGI callable returned without completing response."))
