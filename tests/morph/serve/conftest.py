"""A real server on the tiny model (CPU, fp32, mode "lean"): uvicorn on a free port in a thread, the app of
morph/serve/app.py, its engine in a process of its own that loads the model from the test's model's folder
(tests/serve_faults.py `load_tiny`), waited on until /health says it is warm."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading

import pytest

from tests.http_server import free_port, wait_healthy

API_KEY = "test-key"
LIMITS = dict(width=4, max_frames=400, max_prompt=400)


@contextlib.contextmanager
def serving(tts, voices_dir, fault: dict | None = None, **options):
    """A server's base URL while it runs, over tts's model (fault: tests/serve_faults.py's fault_runner's arguments);
    stopped (its engine's process too) on the way out."""
    import uvicorn

    from morph.serve.app import create_app
    from tests.serve_faults import load_tiny

    app = create_app(functools.partial(load_tiny, str(tts.source), fault), voices_dir, **{"api_key": API_KEY, **LIMITS, **options})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, 120)
    try:
        yield url, app
    finally:
        server.should_exit = True
        thread.join(60)


@pytest.fixture
def server(lean, tmp_path):
    with serving(lean, tmp_path / "voices") as (url, app):
        yield url, app


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)  # the pack's INFO records pass too once a CLI test set its logger to INFO
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_log():
    """The records a server in this process logs meanwhile, at WARNING and above: uvicorn's error log (which does not
    reach the root logger, so caplog misses it) and the pack's."""
    handler = _Records()
    loggers = [logging.getLogger("uvicorn.error"), logging.getLogger("morph")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def no_errors(records: list[logging.LogRecord]) -> None:
    """Nothing an operator's alert would fire on: no record at ERROR or above, and no traceback."""
    bad = [f"{r.levelname}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], bad
