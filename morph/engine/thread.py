"""The engine on a thread of its own, which owns the model and runs other model work (`call`) between frames
(docs/architecture.md, Threads and CUDA streams). A fatal error fails it: every request, held or sent after, ends with
`EngineFailed`, and `on_fatal` tells the owner, who must end the process. `LiveEngine` is the speech server's."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import math
import threading
import time
from typing import Callable

import numpy as np
import torch

from ..errors import Busy, EngineFailed, reason
from ..line_audio import LineAudio
from ..memory import replays_graphs
from ..lines.line import Line
from ..lines.text_split import MAX_SEGMENT_CHARS
from ..prompts import PrivateTokenizer, make_rows
from ..settings import LIVE_MAX_FRAMES, LIVE_MAX_PROMPT, LIVE_WIDTH, GenerationSettings
from .engine import Engine, fatal
from .request import Request, rows_request
from .runner import WARM_FRAMES, prompts_aside, warm_lines, warm_prefills

log = logging.getLogger(__name__)
RETRY_AFTER_MAX_S = 60  # the longest Retry-After OpenAI's client honours


class EngineThread:
    """`engine` run on a thread of its own; on_fatal(error): once, on that thread, when it has failed."""

    def __init__(self, engine: Engine, on_fatal: Callable[[EngineFailed], None] | None = None):
        self.engine, self.tts, self.who = engine, engine.tts, engine.who
        self._cv = engine.cv  # one lock for the engine's queue and this thread's calls
        self._calls: collections.deque = collections.deque()  # (function, future): model work for this thread
        self._closed = False
        self.failure: EngineFailed | None = None
        self.on_fatal = on_fatal
        self._thread = threading.Thread(target=self._serve, name="morph-engine", daemon=True)
        self._thread.start()

    @property
    def width(self) -> int:
        return self.engine.width

    def submit(self, request: Request, who: str) -> Request:
        """Queue a request (EngineFailed, or a RuntimeError once closed)."""
        with self._cv:
            self._check_open(who)
            return self.engine.submit(request)

    def cancel(self, request: Request) -> None:
        self.engine.cancel(request)

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        """Run fn() on the engine's thread between frames: other threads' GPU work could break its captures."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._check_open(self.who)
            self._calls.append((fn, future))
            self._cv.notify_all()
        return future

    def stats(self) -> dict:
        return self.engine.stats()

    def abort(self, error: BaseException) -> None:
        """End every request, waiting or in the batch, and every call not yet run with `error`."""
        with self._cv:
            calls, self._calls = list(self._calls), collections.deque()
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        self.engine.abort(error)

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread once its batch drained, waiting at most `timeout` s; waiting requests end with an error."""
        with self._cv:
            self._closed = True
            calls, self._calls = list(self._calls), collections.deque()
            self._cv.notify_all()
        for _, future in calls:
            future.set_exception(RuntimeError(f"{self.who}: the engine was closed"))
        self.engine.abort(RuntimeError(f"{self.who}: the engine was closed before this request ran"), held=False)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s: the engine's thread had not stopped %.0f s after close; leaving it", self.who, timeout)

    def _check_open(self, who: str) -> None:
        if self.failure is not None:
            raise EngineFailed(f"{who}: {self.failure}")
        if self._closed:
            raise RuntimeError(f"{who}: the engine has been closed")

    # -- the engine's thread ---------------------------------------------------------------
    def _serve(self) -> None:
        try:
            device = self.tts.device
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                while True:
                    with self._cv:
                        while not (self.engine.waiting_rows() or self._calls or self._closed):
                            self._cv.wait()
                    self._run_calls()
                    if self._closed and not self.engine.waiting_rows():
                        return
                    while self.engine.step():
                        self._run_calls()
        except BaseException as e:  # the thread ends: nothing will run the requests any more
            self._fail(e)

    def _fail(self, error: BaseException) -> None:
        log.critical("%s: the engine failed and cannot go on", self.who, exc_info=error)
        failure = EngineFailed(f"the speech engine failed ({reason(error)}) and cannot go "
                               "on; the process must be restarted")
        with self._cv:
            self.failure, self._closed = failure, True
        self.abort(failure)
        if self.on_fatal is not None:
            self.on_fatal(failure)

    def _run_calls(self) -> None:
        with self._cv:
            calls, self._calls = list(self._calls), collections.deque()
        for fn, future in calls:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # the caller's to handle, unless nothing more can run
                    future.set_exception(e)
                    if fatal(e):
                        raise


class LiveEngine(EngineThread):
    """The speech server's engine: requests that come at any time, each one's audio handed out as it is made
    (docs/python-api.md, Requests that come at any time). Every row must fit the batch's cache: submit refuses frames
    over `max_frames` or a prompt over `max_prompt` tokens; more than `max_waiting` rows waiting is `Busy`."""

    def __init__(self, tts, width: int = LIVE_WIDTH, max_frames: int = LIVE_MAX_FRAMES,
                 max_prompt: int = LIVE_MAX_PROMPT, max_waiting: int | None = None, who: str = "Serve",
                 kv_cache_bytes: int | None = None, on_fatal: Callable[[EngineFailed], None] | None = None):
        """kv_cache_bytes: a paged pool of that size, else each row holds its whole capacity."""
        self.max_frames, self.max_prompt = max_frames, max_prompt
        self.max_waiting = 4 * width if max_waiting is None else max_waiting
        self.tokenizer = PrivateTokenizer(tts)  # on the callers' threads: texts' counts and prompts' tokens
        self._ids = itertools.count(1)
        super().__init__(Engine(tts, width, who, need=(max_prompt + max_frames + 1, max_prompt),
                                kv_cache_bytes=kv_cache_bytes),
                         on_fatal)

    def ready(self) -> float | None:
        """Run a full batch of short requests before the first one, which builds the state, captures every width's
        step and the codec's shapes, and compiles the kernels; then capture the prefills of rows joining one or two
        at a time, every prompt length it takes. Seconds taken; None where nothing is captured."""
        tts = self.tts
        if not replays_graphs(tts):
            return None
        log.info("%s: getting the engine ready for %d streams at once (the first time on this machine Triton "
                 "compiles the kernels, about a minute)", self.who, self.width)
        start, left, errors = time.perf_counter(), threading.Semaphore(0), []
        for line in warm_lines(tts, self.width):
            self.submit(line, GenerationSettings(max_new_tokens=WARM_FRAMES, seed=0), lambda wav: None,
                        lambda error: (errors.append(error) if error is not None else None, left.release()))
        for _ in range(self.width):
            left.acquire()
        if errors:
            raise errors[0]
        from ..decode.prefill_graphs import live_shapes  # the decode path loads with a model, not with the nodes

        self.call(lambda: warm_prefills(tts, live_shapes(self.max_prompt))).result()
        seconds = time.perf_counter() - start
        log.info("%s: the engine is ready (%.1f s)", self.who, seconds)
        return seconds

    def submit(self, line: Line, settings: GenerationSettings, on_chunk: Callable[[np.ndarray], None],
               on_end: Callable[[BaseException | None], None], who: str | None = None) -> Request:
        """Check the line (ValueError naming what to change) and queue it; on_chunk(audio) as it is made, on_end(None
        or error) once; both on the engine's thread, and they must not block."""
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
        request = rows_request(rows, settings, self.tokenizer.count, audio.deliver, on_end, audio.chunks.chunk,
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
        # the prompts now, on the caller's thread, so their join costs the engine's loop only the batching (a row
        # with its prompt is equal to one without: the line's audio finds it)
        rows = prompts_aside(self.tts, request.rows, self.tokenizer.tokenize)
        return super().submit(dataclasses.replace(request, rows=rows), who)
