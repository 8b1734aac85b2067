"""A render's frame slots (`SlotProgress`) and a script job's progress; logs, unlike bars, report at a `Cadence`."""

from __future__ import annotations

import time
from typing import Callable, Iterable

from .settings import SAMPLE_RATE

REPORT_EVERY = 5.0  # seconds between plain reports while frames are decoded
MIN_GAP = 1.0  # seconds at least between two reports, however fast lines finish


class SlotProgress:
    """Frame slots across a render's batches (a step of B rows is B slots, ended rows too): on_step(done, total)."""

    def __init__(self, on_step: Callable[[int, int], None] | None, total: int):
        self.on_step, self.total, self.done = on_step, max(int(total), 1), 0

    def report(self, value: int) -> None:
        self.done = min(max(self.done, int(value)), self.total)
        if self.on_step is not None:
            self.on_step(self.done, self.total)

    def finish(self) -> None:
        """The whole render is done: its last report says so, though EOS left frame slots unused."""
        if self.done < self.total:
            self.report(self.total)


def clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d}"


class Cadence:
    """When a plain report is due: at first, then every `every` s, or at an event once `gap` s have passed."""

    def __init__(self, every: float = REPORT_EVERY, gap: float = MIN_GAP):
        self.every, self.gap = every, gap
        self.last: float | None = None
        self.event = False

    def mark(self) -> None:
        self.event = True

    def due(self) -> bool:
        now = time.perf_counter()
        since = None if self.last is None else now - self.last
        if since is None or since >= self.every or (self.event and since >= self.gap):
            self.last, self.event = now, False
            return True
        return False


class JobProgress:
    """One job's tally: time left from the frame slots (`step`), audio and speed from the lines written."""

    def __init__(self, lines: int):
        self.lines, self.done, self.audio_s, self.fraction = lines, 0, 0.0, 0.0
        self.start = time.perf_counter()

    def step(self, done: int, total: int) -> None:
        self.fraction = done / max(total, 1)

    def lines_done(self, samples: Iterable[int]) -> None:
        samples = list(samples)
        self.done += len(samples)
        self.audio_s += sum(samples) / SAMPLE_RATE

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def summary(self, final: bool = False) -> str:
        """'12 of 256 lines | 41.2 s of audio | 88.0x real time | about 0:40 left' (at the end: 'took 0:05')."""
        elapsed = self.elapsed
        if final:
            left = f"took {clock(elapsed)}"
        elif self.fraction > 0.02:
            left = f"about {clock(elapsed * (1 - self.fraction) / self.fraction)} left"
        else:
            left = "estimating"
        return (f"{self.done} of {self.lines} lines | {self.audio_s:.1f} s of audio | "
                f"{self.audio_s / max(elapsed, 1e-9):.1f}x real time | {left}")
