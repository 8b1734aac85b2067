"""bench/common.py's stacks_on_timeout: a bench stopped by `timeout` (SIGTERM) prints where every thread was, even one
blocked in a call that never returns, and still ends as SIGTERM ends it."""

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUCK = """
import threading, time
from bench.common import stacks_on_timeout

def waiting_for_the_gpu():
    threading.Event().wait()  # blocks in C, as a CUDA call that never returns does

stacks_on_timeout()
print("ready", flush=True)
waiting_for_the_gpu()
"""


def test_sigterm_prints_every_threads_stack_and_ends_the_process():
    child = subprocess.Popen([sys.executable, "-c", STUCK], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGTERM
    assert "most recent call first" in err and "in waiting_for_the_gpu" in err


def test_without_it_sigterm_prints_nothing():
    """The control: the default SIGTERM ends the same process silently, so the stack above is the helper's."""
    child = subprocess.Popen([sys.executable, "-c", STUCK.replace("stacks_on_timeout()\n", "")], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGTERM and "waiting_for_the_gpu" not in err
