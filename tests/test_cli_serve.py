"""`cli.py serve`: its flags are checked before the model loads, the server it starts answers the pack's load test
(bench/serve.py, which starts it as a user would, saves a voice and streams speech from it) on the tiny model, and the
process ends as a supervisor needs: 1 when it cannot start (a port in use, found before the model loads; a model that
does not load) or its engine keeps failing (the requests that arrive meanwhile answered 503), 0 after a bounded drain
on SIGTERM."""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import cli
from bench import serve as load_test
from tests.http_server import free_port, wait_for, wait_healthy
from tests.morph.serve.test_app import wav_bytes

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("flags,message", [
    (["--batch-size", "0"], "error: --batch-size must be >= 1, got 0"),
    (["--max-frames", "0"], "error: --max-frames must be >= 1, got 0"),
    (["--temperature", "0"], "error: --temperature must be > 0"),
    (["--seed", "-2"], "error: --seed must be >= 0"),
    (["--kv-cache-gib", "0"], "error: --kv-cache-gib must be > 0"),
    (["--shutdown-timeout", "-1"], "error: --shutdown-timeout must be >= 0 seconds, got -1.0"),
])
def test_bad_flags_are_refused_before_loading(flags, message, capsys, no_load):
    assert cli.main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_command_is_known(capsys):
    assert cli.main(["serv"]) == 2
    assert "did you mean serve?" in capsys.readouterr().err


def test_the_server_it_starts_streams_speech_to_the_load_test_and_comes_back_from_a_killed_engine(tiny_dir, tmp_path):
    """Then the load test's kill window: the engine process its server logged is killed 0.8 s into a window whose
    first request (0.64 s, 7.7 s of speech) it holds then; that one is cut off within a second, and the requests
    sent once /health answers again get their audio."""
    report = load_test.main(["--serve", f"--model {tiny_dir} --device cpu --voices {tmp_path / 'voices'} "
                                       "--batch-size 4 --api-key k --kv-cache-gib 0.001", "--api-key", "k", "--rates", "2",
                             "--duration", "2", "--kill-engine", "0.8", "--json", str(tmp_path / "serve.json")])
    summary = report["rates"][0]["summary"]
    assert report["complete"] and report["voice_made"]
    assert summary["sent"] >= 1 and summary["ok"] == summary["sent"] and not summary["errors"]
    assert summary["audio_s_total"] > 0 and summary["ttfa_p50_s"] < summary["e2e_p50_s"]
    assert (tmp_path / "voices" / "alice.safetensors").is_file()
    kill = report["kill"]
    log = (tmp_path / "serve.server.log").read_text()
    assert f"the engine's process {kill['pid']} is up" in log and "killed by SIGKILL" in log
    held = kill["summary"]
    assert held["held"] >= 1 and held["held_in_time"] == held["held"] and "ok" not in held["held_outcomes"]
    assert held["sent_after_in_time"] == held["sent_after"]
    assert kill["restart_s"] is not None and [r["ok"] for r in kill["after_restart"]] == [True] * 3


def serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "cli.py", "serve", "--device", "cpu", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_a_port_in_use_exits_1_before_the_model_loads(tiny_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = serve("--model", str(tiny_dir), "--voices", str(tmp_path / "voices"), "--port", str(port))
    assert run.returncode == 1, run.stderr
    assert (f"CRITICAL: serve: cannot listen on 127.0.0.1:{port} (Address already in use); stop what listens there, "
            "or choose another --host or --port; exiting with status 1") in run.stderr
    assert "loading" not in run.stderr and "engine's process" not in run.stderr  # no model was loaded


def test_a_model_that_does_not_load_exits_1(tiny_dir, tmp_path):
    """A checkpoint whose weights file is cut short: the engine's process cannot load it, and the server's start
    fails with 1 (uvicorn's own exit for a failed startup is 3), saying why."""
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_dir, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    run = serve("--model", str(corrupt), "--voices", str(tmp_path / "voices"), "--port", str(free_port()))
    assert run.returncode == 1, run.stderr
    assert re.search(r"CRITICAL: serve: the speech engine's process could not start: .*corrupt.*; exiting with status 1",
                     run.stderr), run.stderr


@contextlib.contextmanager
def faulty_server(tiny_dir, tmp_path, mode, *flags):
    """`cli.py serve` in a process of its own, its engine given a fault (tests/serve_faults.py); its URL and process
    once /health is 200."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.serve_faults", mode, "--model", str(tiny_dir), "--device",
                                "cpu", "--voices", str(tmp_path / "voices"), "--port", str(port), "--batch-size", "2",
                                *flags], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        # a loaded machine: the load and the warm-up can take minutes
        wait_healthy(url, 300, alive=lambda: process.poll() is None)
        reply = httpx.post(f"{url}/v1/audio/voices", data={"name": "alice"}, timeout=60,
                           files={"audio_sample": ("a.wav", wav_bytes(np.random.default_rng(0).normal(
                               0, 0.1, 24000).astype(np.float32)), "audio/wav")})
        assert reply.status_code == 200, reply.text
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_an_engine_that_keeps_failing_ends_the_process_with_an_error(tiny_dir, tmp_path):
    """A device-side assert in the batch: the request gets 503 naming it and the engine's process is started again;
    once that has happened RESTARTS times, the process exits 1 within seconds, for its supervisor to restart it. The
    requests sent as it gives up get its 503 (server_failed), not a dropped connection."""
    from morph.serve.lifecycle import RESTARTS

    with faulty_server(tiny_dir, tmp_path, "fail") as (url, process):
        for attempt in range(RESTARTS):
            wait_healthy(url, 300, alive=lambda: process.poll() is None)
            reply = httpx.post(f"{url}/v1/audio/speech", timeout=60, json={"input": "FAIL now.", "voice": "alice",
                                                                           "response_format": "wav", "stream": False})
            failed = time.monotonic()
            assert reply.status_code == 503 and "device-side assert" in reply.json()["error"]["message"]
            if attempt == RESTARTS - 1:  # the last: the server gives up now; what is sent meanwhile is answered
                codes = []
                while time.monotonic() - failed < 0.5:
                    late = httpx.post(f"{url}/v1/audio/speech", timeout=10, json={"input": "Hi.", "voice": "alice"})
                    assert late.status_code == 503, late.text
                    codes.append(late.json()["error"]["code"])
                    assert late.headers.get("connection") == "close" or codes[-1] == "engine_failed", late.headers
                assert "server_failed" in codes and set(codes) <= {"server_failed", "engine_failed"}, codes
            try:  # until the server has seen the engine's process end
                while process.poll() is None and httpx.get(f"{url}/health").status_code == 200:
                    time.sleep(0.02)
            except httpx.TransportError:  # it has exited
                pass
        assert process.wait(15) == 1
        assert time.monotonic() - failed < 10


def test_sigterm_drains_within_the_shutdown_timeout_then_exits_0(tiny_dir, tmp_path):
    """SIGTERM while a short and a stuck request run: /health says draining and new requests get 503 at once, the
    short one finishes whole, the stuck one is cut off with a 503 once --shutdown-timeout has passed, and the process
    exits 0."""
    with faulty_server(tiny_dir, tmp_path, "slow", "--shutdown-timeout", "8") as (url, process), \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        def speak(text, frames, **extra):
            return pool.submit(httpx.post, f"{url}/v1/audio/speech", timeout=60, json={
                "input": text, "voice": "alice", "response_format": "wav", "stream": False, "max_new_tokens": frames,
                **extra})

        def live_rows():
            return float(re.search(r"^morph_rows_live (\S+)$", httpx.get(f"{url}/metrics").text, re.M).group(1))

        # 0.1 s a frame: 40 s. Seeded: the tiny model's random weights end a row early on some seeds (3 of 20 in
        # under 80 frames, one CI run's stuck request among them); seed 0 runs all 400 frames.
        stuck = speak("SLOW and long.", 400, seed=0)
        wait_for(lambda: live_rows() >= 1)
        short = speak("Short.", 2)
        wait_for(lambda: live_rows() >= 2)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.3)
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and health.json() == {"status": "draining"}
        refused = httpx.post(f"{url}/v1/audio/speech", json={"input": "Hi.", "voice": "alice"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        assert short.result(30).status_code == 200
        cut = stuck.result(30)
        assert cut.status_code == 503 and "shutdown timeout is 8 s" in cut.json()["error"]["message"]
        assert 8 <= time.monotonic() - signalled < 16
        assert process.wait(15) == 0
