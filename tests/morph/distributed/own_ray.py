"""Ray processes a test started, and only those: a machine may run other people's Ray clusters, which a test must
neither count nor stop. Every process a test starts (its pool's local cluster, a `ray start` head, a job in a process
of its own) inherits the test's mark in its environment, and Ray's workers inherit it from their raylet."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

MARK = "MORPH_TEST_RAY"
RAY_CLI = str(Path(sys.executable).parent / "ray")


class OwnRay:
    def __init__(self, mark: str):
        self.mark, self.temps = f"{MARK}={mark}".encode(), []

    def processes(self) -> list[int]:
        """The processes other than this one that carry this test's mark."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:  # gone, or another user's
                continue
            if self.mark in environ and int(pid) != os.getpid():
                found.append(int(pid))
        return found

    def left(self, seconds: float = 10) -> list[int]:
        """The test's processes still running after up to `seconds` (Ray's processes end in their own time)."""
        end = time.monotonic() + seconds
        while self.processes() and time.monotonic() < end:
            time.sleep(0.25)
        return self.processes()

    def stop(self) -> None:
        """Stop the test's processes: SIGTERM, then SIGKILL whatever is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if not self.left(10):
                break
        for temp in self.temps:
            shutil.rmtree(temp, ignore_errors=True)

    def head(self, cwd: Path, env: dict) -> str:
        """`ray start --head` run from `cwd` with a temp dir of its own (short: Ray's socket paths have a length
        limit), so it neither reads nor rewrites the machine's /tmp/ray; returns its address. Ray 2.59+ starts it with
        token authentication: `env` (whose HOME should be the test's own) gets the token and RAY_AUTH_MODE=token, for
        the jobs that join it."""
        env["RAY_AUTH_MODE"] = "token"
        if not (Path(env["HOME"]) / ".ray" / "auth_token").is_file():
            token = subprocess.run([RAY_CLI, "get-auth-token", "--generate"], capture_output=True, text=True, env=env)
            assert token.returncode == 0, token.stderr[-2000:]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.temps.append(tempfile.mkdtemp(prefix="ray-"))
        cwd.mkdir(parents=True, exist_ok=True)
        started = subprocess.run([RAY_CLI, "start", "--head", "--port", str(port), "--num-cpus", "2", "--temp-dir",
                                  self.temps[-1], "--include-dashboard=false", "--disable-usage-stats"], cwd=cwd,
                                 capture_output=True, text=True, env=env)
        assert started.returncode == 0, started.stderr[-2000:]
        return f"127.0.0.1:{port}"


@pytest.fixture
def own_ray(monkeypatch):
    """The test's mark, in its environment before it starts any Ray process; its processes are stopped after it."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    ray = OwnRay(mark)
    yield ray
    ray.stop()
