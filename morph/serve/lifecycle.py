"""The server's state, owned here alone (what a client sees: docs/serving.md, When something fails): `loading`,
`serving`, `draining` after SIGTERM or SIGINT (then exit 0), `restarting` while the engine's process starts again,
`failed` (exit 1). `Gate` checks each request and WebSocket session: its key, the state, its body's size."""

from __future__ import annotations

import hmac
import logging
import os
import socket
import sys
import threading
import time
from urllib.parse import parse_qs

from .protocol import ApiError, CutOff

log = logging.getLogger(__name__)

LOADING, SERVING, RESTARTING, DRAINING, FAILED = "loading", "serving", "restarting", "draining", "failed"
RESTARTS, RESTART_WINDOW_S = 3, 300  # the engine's process ending this often gives up: a crash loop, not a fault
MAX_JSON_BYTES = 8 << 20  # a speech request may carry its reference clip as base64 (ref_audio)
MAX_UPLOAD_BYTES = 25 << 20  # a voice upload (multipart): OpenAI's limit for an audio file
UPLOAD_ROUTE = "/v1/audio/voices"
OPEN_ROUTES = ("/health", "/metrics")
GRACE_S = 5  # after the state says exit: for the answers already decided to go out, and the engine to stop
FAILED_ANSWER_S = 2  # once failed: requests that arrive as it gives up (sent before they knew) still get its 503


class Lifecycle:
    """Any thread may change the state; the first failure's reason is kept."""

    def __init__(self):
        self._lock = threading.Lock()
        self.state, self.reason = LOADING, None
        self.active = 0  # requests past the gate and not yet answered (the event loop's alone)
        self._ended: list[float] = []  # when the engine's process ended, within the last RESTART_WINDOW_S

    def ready(self) -> None:
        with self._lock:
            if self.state in (LOADING, RESTARTING):
                self.state, self.reason = SERVING, None

    def engine_ended(self, reason: str) -> bool:
        """True when the ended engine process is to start again (`restarting`); False: the server gives up or stops."""
        now = time.monotonic()
        with self._lock:
            self._ended = [t for t in self._ended if now - t < RESTART_WINDOW_S] + [now]
            if self.state in (DRAINING, FAILED):
                return False
            if len(self._ended) < RESTARTS:
                self.state, self.reason = RESTARTING, reason
                log.error("serve: %s; starting the engine again", reason)
                return True
        self.fail(f"the speech engine ended {RESTARTS} times within {RESTART_WINDOW_S} s, last: {reason}")
        return False

    def drain(self) -> bool:
        """Stop admitting requests; False when already draining or failed."""
        with self._lock:
            if self.state in (DRAINING, FAILED):
                return False
            self.state = DRAINING
            return True

    def fail(self, reason: str) -> None:
        with self._lock:
            if self.state == FAILED:
                return
            self.state, self.reason = FAILED, reason
        log.critical("serve: %s; exiting with status 1 for a supervisor to restart the server", reason)

    def health(self) -> tuple[int, dict]:
        state, reason = self.state, self.reason
        if state == SERVING:
            return 200, {"status": "ok"}
        return 503, {"status": state, **({"error": reason} if reason else {})}

    def refusal(self) -> ApiError | None:
        """Why a new request is refused now, or None."""
        state, reason = self.state, self.reason
        if state == DRAINING:
            return ApiError(503, "the server is shutting down and takes no new requests; send the request to another "
                                 "server, or again once this one is back", None, "server_shutting_down", "server_error")
        if state == RESTARTING:
            return ApiError(503, f"the server's speech engine is being restarted ({reason}); send the request again "
                                 "in a few seconds", None, "server_restarting", "server_error", {"Retry-After": "5"})
        if state == FAILED:  # the connection closes with the answer: the process is about to exit
            return ApiError(503, f"this server has failed and is exiting to be restarted: {reason}; send the request "
                                 "again once it is back", None, "server_failed", "server_error",
                            {"Connection": "close"})
        return None


class Gate:
    """ASGI middleware: the door (module docstring)."""

    def __init__(self, app, lifecycle: Lifecycle, api_key: str | None):
        self.app, self.lifecycle, self.api_key = app, lifecycle, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):  # a WebSocket's refusal is an HTTP answer to its handshake
            return await self.app(scope, receive, send)
        path = scope["path"]
        refusal = None if path == "/health" else self._unauthorized(scope)
        if refusal is None and path not in OPEN_ROUTES:
            refusal = self.lifecycle.refusal()
        if refusal is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            cap = MAX_UPLOAD_BYTES if path == UPLOAD_ROUTE else MAX_JSON_BYTES
            body, refusal = await _read_body(scope, receive, cap)
            if body is None and refusal is None:  # the client left while sending
                return None
            receive = _replay(body, receive)
        if refusal is not None:
            return await refusal.response()(scope, receive, send)
        counted = path not in OPEN_ROUTES
        self.lifecycle.active += counted
        try:
            await self.app(scope, receive, send)
        finally:
            self.lifecycle.active -= counted

    def _unauthorized(self, scope) -> ApiError | None:
        if not self.api_key:
            return None
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, key = given.strip().partition(" ")
        websocket = scope["type"] == "websocket"
        if websocket and not given:  # a browser's WebSocket cannot send headers: its key comes as ?api_key=
            scheme, key = "bearer", parse_qs(scope["query_string"].decode("latin-1")).get("api_key", [""])[0]
        if scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode("latin-1", "replace"),
                                                              self.api_key.encode()):
            return None
        return ApiError(401, "the API key is missing or wrong; send Authorization: Bearer <key>"
                        + (" or ?api_key=<key>" if websocket else ""), None, "invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer"})


async def _read_body(scope, receive, cap: int) -> tuple[bytes | None, ApiError | None]:
    """The body; or the 413 once over `cap` (by its Content-Length before reading); or (None, None): the client left."""
    too_large = ApiError(413, f"the request body is over this server's {cap >> 20} MiB; send a shorter clip or text",
                         None, "request_too_large")
    length = dict(scope["headers"]).get(b"content-length", b"")
    if length.isdigit() and int(length) > cap:
        return None, too_large
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, None
        parts.append(message.get("body", b""))
        size += len(parts[-1])
        if size > cap:
            return None, too_large
        if not message.get("more_body", False):
            return b"".join(parts), None


def _replay(body: bytes, receive):
    """receive() that gives the body read already, then what the connection says next (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay():
        return pending.pop() if pending else await receive()
    return replay


class _Deliberate(logging.Filter):
    """uvicorn's error log less what the server does on purpose: a stream it cut off (CutOff, logged already), and a
    WebSocket handshake the Gate refused (this app's route accepts first, so that record is never its own failure)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "ASGI callable returned without completing handshake.":
            return False
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if isinstance(error, CutOff):
                return False
            error = error.__cause__ or error.__context__
        return True


_DELIBERATE = _Deliberate()


def quiet_uvicorn() -> None:
    """Put _Deliberate on uvicorn's error log (once, however many apps are made: addFilter skips one it holds)."""
    logging.getLogger("uvicorn.error").addFilter(_DELIBERATE)


def run_server(app, host: str, port: int, shutdown_timeout: float) -> int:
    """Serve `app` (create_app's) until a signal has drained it (0), or it fails to start or go on (exits 1 at once)."""
    import uvicorn

    lifecycle: Lifecycle = app.state.lifecycle

    class Server(uvicorn.Server):
        deadline = cut = failed = None

        def handle_exit(self, sig, frame) -> None:
            """SIGTERM, SIGINT: drain; a second one cuts the rest off now (uvicorn would stop at once instead)."""
            now = time.monotonic()
            if lifecycle.drain():
                log.warning("serve: draining: no new requests, %d in flight get up to %g s", lifecycle.active,
                            shutdown_timeout)
                self.deadline = now + shutdown_timeout
            else:
                self.deadline = now

        async def on_tick(self, counter: int) -> bool:
            if await super().on_tick(counter):
                return True
            now = time.monotonic()
            if lifecycle.state == FAILED:  # answering 503 a moment longer: then the listener closes
                self.failed = self.failed or now
                return now >= self.failed + FAILED_ANSWER_S
            if lifecycle.state != DRAINING:
                return False
            if lifecycle.active and now >= self.deadline and self.cut is None:
                self.cut = now
                log.warning("serve: cutting off %d requests still in flight after %g s", lifecycle.active,
                            shutdown_timeout)
                app.state.speech.engine.abort(ApiError(
                    503, f"the server shut down before this request finished (its shutdown timeout is "
                         f"{shutdown_timeout:g} s); send it again", None, "server_shutting_down", "server_error"))
            return not lifecycle.active or (self.cut is not None and now >= self.cut + GRACE_S)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_S)
    try:
        with _bind(host, port) as listener:
            Server(config).run(sockets=[listener])
    except OSError as e:  # from the bind; or from the listen, when another server bound the port while the model loaded
        lifecycle.fail(f"cannot listen on {host}:{port} ({e.strerror or e}); stop what listens there, or choose "
                       "another --host or --port")
    except SystemExit:  # uvicorn's own exit when the app's startup (the model's load) failed: 3 in its newer versions
        lifecycle.fail("the server did not start")  # the load's failure, when that said why first, is kept
    if lifecycle.state != FAILED:
        return 0
    # every request is answered; the interpreter's teardown (stopping the engine's process, its pipe's readers) could
    # only delay the status the supervisor acts on
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _bind(host: str, port: int) -> socket.socket:
    """Bound before the model loads (a port in use is found then), listened on after (a client meanwhile is refused)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart finds the port free at once
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    return listener
