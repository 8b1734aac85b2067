"""EngineProcess's own life (morph/engine/process.py): what the served engine does is tested through the server in
tests/morph/serve/."""

from __future__ import annotations

import functools
import logging
import time

from morph.engine.process import STOP_S, EngineProcess
from tests.serve_faults import load_leaving_a_thread


def test_a_closed_engine_process_exits_at_once_though_a_thread_is_left_running(tiny_dir, caplog):
    """The interpreter's teardown would wait for that thread for ever: the child was terminated STOP_S after the
    drain's timeout, with a warning, as a server on an H100 was at every shutdown."""
    engine = EngineProcess(functools.partial(load_leaving_a_thread, str(tiny_dir)),
                           dict(width=2, max_frames=50, max_prompt=200))
    engine.start()
    process = engine._process
    caplog.set_level(logging.WARNING, "morph")
    began = time.perf_counter()
    engine.close(1)
    assert time.perf_counter() - began < 1 + STOP_S
    assert process.exitcode == 0
    assert "has not stopped" not in caplog.text
