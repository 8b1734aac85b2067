"""The speech server's engine (morph/serve/): the engine on a thread of its own (morph/engine/thread.py), taking
requests that come at any time, each one's audio handed out as it is made (usage: docs/python-api.md, Requests that
come at any time). A long text's segments run in turn and join with a pause (morph/line_audio.py).

Every row must fit the batch's cache (`need` slots: prompt, frames, EOS slot): a row's frames are capped at
`max_frames`, its prompt at `max_prompt` tokens (submit refuses a request over either, naming the field). Too many rows
waiting (`max_waiting`) is `Busy`, with a wait to try again after, rather than an unbounded queue. Failures are the
engine's (morph/engine/engine.py) and its thread's (morph/engine/thread.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable

import numpy as np

from .engine.engine import Engine, fatal
from .engine.request import Request
from .engine.thread import EngineThread
from .errors import Busy, EngineFailed
from .line_audio import LineAudio
from .lines.line import Line
from .lines.text_split import MAX_SEGMENT_CHARS
from .prompts import make_rows, token_count
from .render import rows_request
from .settings import LIVE_MAX_FRAMES, LIVE_MAX_PROMPT, LIVE_WIDTH, GenerationSettings

RETRY_AFTER_MAX_S = 60  # the longest Retry-After OpenAI's client honours

__all__ = ["LiveEngine", "fatal"]


class LiveEngine(EngineThread):
    """The server's engine (module docstring)."""

    def __init__(self, tts, width: int = LIVE_WIDTH, max_frames: int = LIVE_MAX_FRAMES,
                 max_prompt: int = LIVE_MAX_PROMPT, max_waiting: int | None = None, who: str = "Serve",
                 kv_cache_bytes: int | None = None, on_fatal: Callable[[EngineFailed], None] | None = None):
        """kv_cache_bytes: the talker's keys and values in a paged pool of that size (rows join while their pages
        can be set aside), else each of the `width` rows holds its whole capacity. on_fatal(error): once, on the
        engine's thread, when the engine has failed."""
        self.max_frames, self.max_prompt = max_frames, max_prompt
        self.max_waiting = 4 * width if max_waiting is None else max_waiting
        self.count_tokens = token_count(tts, private=True)  # a text's tokens, on any thread
        self._ids = itertools.count(1)
        super().__init__(Engine(tts, width, who, need=max_prompt + max_frames + 1, kv_cache_bytes=kv_cache_bytes),
                         on_fatal)

    def submit(self, line: Line, settings: GenerationSettings, on_chunk: Callable[[np.ndarray], None],
               on_end: Callable[[BaseException | None], None], who: str | None = None) -> Request:
        """Check the line (ValueError naming what to change) and queue it; on_chunk(audio) as its audio is made,
        on_end(None) once it is whole (or on_end(error)); both on the engine's thread, and they must not block."""
        who = who or self.who
        settings = settings.validate(who)
        if settings.max_new_tokens is not None and settings.max_new_tokens > self.max_frames:
            raise ValueError(f"{who}: max_new_tokens is {settings.max_new_tokens}, over this server's "
                             f"{self.max_frames} frames a segment; send at most {self.max_frames}")
        with self._cv:
            rid = next(self._ids)
        rows = [dataclasses.replace(r, limit=min(r.limit, self.max_frames))
                for r in make_rows(self.tts, [line], settings, who, True, [f"request {rid}"])]
        audio = LineAudio(rows, 1, on_line=None, on_chunk=lambda i, wav: on_chunk(wav), streamed=True)
        request = rows_request(rows, settings, self.count_tokens, audio.deliver, on_end, audio.chunks.chunk,
                               audio.restart, in_order=True, id=rid)
        for tokens in request.prompts:
            if tokens > self.max_prompt:
                raise ValueError(f"{who}: the prompt takes {tokens} tokens (text of up to {MAX_SEGMENT_CHARS} "
                                 f"characters a segment, and the voice's reference), over this server's "
                                 f"{self.max_prompt}; use a shorter reference clip or transcript")
        with self._cv:
            waiting = self.engine.waiting_rows()
            excess = waiting + len(rows) - self.max_waiting
            if excess > 0 and self.failure is None and not self._closed:
                # a slot frees about every row_seconds / width: the queue has room once `excess` have
                wait = min(RETRY_AFTER_MAX_S, max(1, math.ceil(excess * self.engine.row_seconds / self.width)))
                raise Busy(f"{who}: {waiting} rows are waiting, the most this server queues is "
                           f"{self.max_waiting}; try again in {wait} s", wait)
            return super().submit(request, who)
