"""Faults put into the speech server's engine from outside, for its tests: `fault_runner` is a RowRunner (the live
engine's batch, morph/continuous.py) that raises `error` at each frame once a row whose text holds FAIL has joined
(`times` times at most), and sleeps `delay` seconds a frame while a row whose text holds SLOW is in it. The engine runs
in a process of its own (morph/engine/process.py): the fault is set there, by the model's loader (`load_tiny`,
`load_faulty`).

    python -m tests.serve_faults fail|slow SERVE_ARGS...   # cli.py serve with that fault (tests/test_cli_serve.py)
    python -m tests.serve_faults assert SERVE_ARGS...      # on a GPU: a real device-side assert (an index out of
                                                           # bounds on the device), as the issue's load test met
"""

from __future__ import annotations

import functools
import os
import sys
import time

from morph.engine.runner import RowRunner

CUDA_ASSERT = "CUDA error: device-side assert triggered"
# how long a frame waits while a SLOW row runs, where a test or the `slow` mode asks for it
SLOW_DELAY = 0.1


def fault_runner(error: BaseException | type[BaseException] | None = None, times: int | None = None,
                 delay: float = 0.0):
    """`error`: an exception, or a class made only when it is raised (at the fault's frame)."""
    left = [times]

    class FaultyRunner(RowRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.failing, self.slow = set(), set()  # the rows taken whose text asks for a fault

        def step(self, take, before_frame=None, *args, **kwargs):
            def taking(n):
                rows = take(n)
                self.failing.update(r for r, _ in rows if "FAIL" in r.text)
                self.slow.update(r for r, _ in rows if "SLOW" in r.text)
                return rows

            def frame(n):
                before_frame(n)
                if self.slow & {row.name for row in self.batch.live.values()}:
                    time.sleep(delay)
                if self.failing and error is not None and left[0] != 0:
                    left[0] = None if left[0] is None else left[0] - 1
                    raise error

            stepped = super().step(taking, frame, *args, **kwargs)
            if not stepped:  # the run is over: the next one's rows are its own
                self.failing.clear()
                self.slow.clear()
            return stepped

    return FaultyRunner


def load_tiny(source: str, fault: dict | None = None):
    """A server's model for the tests, in its engine's process: the tiny model at `source` (CPU, fp32, mode "lean"),
    its engine given fault_runner(**fault)."""
    import morph.engine.engine
    from morph.api import MorphTTS

    if fault is not None:
        morph.engine.engine.RowRunner = fault_runner(**fault)
    tts = MorphTTS.load(source, device="cpu", dtype="fp32", attention="sdpa")
    tts.patch.mode = "lean"
    return tts


def load_leaving_a_thread(source: str):
    """load_tiny, and a thread that never ends and is no daemon, as a library may leave one in the engine's process."""
    import threading

    threading.Thread(target=threading.Event().wait, name="left-running").start()
    return load_tiny(source)


def hold(tts, gate: str) -> None:
    """Model work that holds the engine's thread until the file `gate` exists (EngineProcess.call)."""
    while not os.path.exists(gate):
        time.sleep(0.01)


def load_faulty(mode: str, args):
    """cli_serve.load_served with the fault `mode`, in the engine's process."""
    import cli_serve
    import morph.engine.engine

    morph.engine.engine.RowRunner = fault_runner(**{"fail": dict(error=RuntimeError(CUDA_ASSERT)),
                                                    "slow": dict(delay=SLOW_DELAY),
                                                    "assert": dict(error=_DeviceAssert)}[mode])
    return cli_serve.load_served(args)


def main(argv: list[str]) -> int:
    import cli
    import cli_serve

    mode, serve_args = argv[0], argv[1:]
    cli_serve.load_served = functools.partial(load_faulty, mode)  # pickled by name: the child loads through it
    return cli.main(["serve", *serve_args])


class _DeviceAssert(BaseException):
    """Made at the fault's frame, it runs a kernel that indexes out of bounds: what is raised is CUDA's own error."""

    def __init__(self):
        super().__init__()
        import torch

        index = torch.tensor([1 << 20], device="cuda")
        torch.zeros(4, device="cuda")[index].sum().item()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
