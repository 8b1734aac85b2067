"""A local HTTP server for the tests: a free port, and the wait until its /health answers 200."""

from __future__ import annotations

import socket
import time
from typing import Callable

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, seconds: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Until GET url/health is 200; fails after `seconds`, or as soon as alive() is False (the server exited)."""
    deadline = time.monotonic() + seconds
    while True:
        assert alive(), "the server exited while starting"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.1)


def wait_for(check, seconds: float = 30.0) -> None:
    """Until check() is true; a failed assertion after `seconds`, so that a test never hangs on it."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
