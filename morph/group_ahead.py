"""The next group's prompt, built on a worker thread while the continuous batch runs (morph/continuous.py RowRunner).

A group's prompt is built on the host a row at a time (morph/prompts.py); on the frame loop's thread it would hold the
loop at every group while the GPU runs out of queued frames (bench/results/h100-2026-11-26f/NOTES.md). A render's rows
are known ahead, so the next group is built beside the loop, on the pack's "prompts" stream under the capture lock
(docs/architecture.md, Threads and CUDA streams).

A server's requests (morph/live_engine.py) are not taken ahead: a request taken early could be cancelled where
nothing looks for it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

import torch

from .graphs import CAPTURE_LOCK, PROMPTS, side_stream

if TYPE_CHECKING:
    from .decode.groups import Group


class GroupAhead:
    """Groups of up to `width` rows from take(n) (a render's rows, with their stream keys), each built by
    build(chunk), the next one on a worker thread while the caller runs the one before; the first starts now."""

    def __init__(self, build: Callable[[list], "Group"], take: Callable[[int], list], width: int,
                 device: torch.device):
        self.build, self.take, self.width, self.device = build, take, width, device
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="morph-prompts")
        self._next: Future | None = None
        self.start()

    def start(self) -> None:
        """Take the next rows and start building their group (none when no row waits)."""
        chunk = self.take(self.width)
        if not chunk:
            self._next = None
            return
        after = None
        if self.device.type == "cuda":  # the caller's work so far, which the worker's stream waits for
            after = torch.cuda.Event()
            after.record(torch.cuda.current_stream(self.device))
        self._next = self._worker.submit(self._build, chunk, after)

    def next(self) -> "Group | None":
        """The group built ahead, ready for the caller's stream, and the one after it started; None when no row
        is left (rows put back since the last start are taken now, and built while the caller waits)."""
        if self._next is None:
            self.start()
            if self._next is None:
                return None
        group, done = self._next.result()
        if done is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(done)
            for t in group.prompt.values():
                t.record_stream(stream)
        self.start()
        return group

    def close(self) -> None:
        """Wait for a group being built and stop the worker: the caller is done, and its rows are dropped."""
        self._worker.shutdown(wait=True)
        self._next = None

    def _build(self, chunk: list, after: "torch.cuda.Event | None") -> tuple["Group", "torch.cuda.Event | None"]:
        with torch.inference_mode():
            if after is None:
                return self.build(chunk), None
            stream = side_stream(self.device, PROMPTS)
            with CAPTURE_LOCK, torch.cuda.device(self.device), torch.cuda.stream(stream):
                stream.wait_event(after)
                group = self.build(chunk)
                done = torch.cuda.Event()
                done.record(stream)
            return group, done
