"""Requests that come at any time, through one running continuous batch, each one's audio handed out as it is made:
what the speech server (morph/serve/) runs.

    engine = LiveEngine(tts, width=16)
    request = engine.submit(Line("Hello.", voice), GenerationSettings(seed=1), on_chunk=play, on_end=done)
    request.cancel()  # a client that went away: its rows end at the next frame, its slots free

One thread owns the model: it runs a RowRunner (morph/continuous.py) whose rows come from the requests waiting, in
the order they came (a long text's segments in turn, joined with a pause, morph/line_audio.py), keeps it built between
bursts (its CUDA graphs are captured once), and runs other model work handed to it (`call`) between frames. A batch
samples with one set of settings (sampling and seq_groups: what its step and graphs hold); a request with others
waits until the requests before it are done, then the batch is built again for it. Per request: the seed (each row
draws from its own random stream, so a seeded request's take does not depend on its neighbours) and max_new_tokens.

Every row must fit the batch's cache (`need` slots: prompt, frames, EOS slot): a row's frames are capped at
`max_frames`, its prompt at `max_prompt` tokens (submit refuses a request over either, naming the field). Too many rows
waiting (`max_waiting`) is `Busy`, with a wait to try again after, rather than an unbounded queue.

A failed batch fails the requests in it and the engine goes on, but for two cases. Out of memory, it backs off as
BatchTTS does: the batch narrows to half its rows and the rows that have handed out no audio run again (a request whose
unfinished rows had streamed audio fails). An error that leaves the CUDA context unusable (a device-side assert, an
illegal memory access: `fatal`), or the engine's thread ending any other way, fails the engine: every request it holds
ends at once with `EngineFailed`, so do those sent after, and `on_fatal` tells the owner, who must end the process."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import threading
import time
from typing import Callable

import numpy as np
import torch

from .continuous import RowRunner, budget_pages, runs_lean
from .engine.scheduler import back_off
from .errors import reason
from .line_audio import LineAudio
from .lines.line import Line, Row
from .lines.text_split import MAX_SEGMENT_CHARS
from .prompts import make_rows, prompt_tokens, stream_keys, token_count
from .settings import LIVE_MAX_FRAMES, LIVE_MAX_PROMPT, LIVE_WIDTH, GenerationSettings

log = logging.getLogger(__name__)

RETRY_AFTER_MAX_S = 60  # the longest Retry-After OpenAI's client honours
# What torch's errors say when the CUDA context is lost: nothing more can run in this process.
FATAL_WORDS = ("CUDA error", "device-side assert", "illegal memory access")


class Busy(RuntimeError):
    """More rows wait than the engine queues: try again after `retry_after` seconds."""
    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class EngineFailed(RuntimeError):
    """The engine cannot go on (its CUDA context failed, or its thread ended): what every request it held, and every
    request after, ends with."""


def fatal(error: BaseException) -> bool:
    """Whether an error leaves the CUDA context unusable (out of memory does not)."""
    return not isinstance(error, torch.cuda.OutOfMemoryError) and any(w in str(error) for w in FATAL_WORDS)


@dataclasses.dataclass(eq=False)
class Request:
    """One request in the engine: its rows, its settings, where its audio goes, and how far it has got."""

    id: int
    rows: list[Row]
    keys: list[int]  # each row's random stream
    settings: GenerationSettings
    on_chunk: Callable[[np.ndarray], None]  # float32 24 kHz audio, in order, on the engine's thread
    on_end: Callable[[BaseException | None], None]  # once: None when whole, else why it stopped
    engine: "LiveEngine"
    state: str = "waiting"  # waiting, running, done, failed, cancelled
    audio: LineAudio | None = None  # its rows' audio, joined in order

    @functools.cached_property
    def batch_key(self) -> GenerationSettings:
        """What the batch that runs it must sample with: its settings but the per-row ones (read at every frame
        the batch has a free slot, so made once)."""
        return dataclasses.replace(self.settings, seed=None, max_new_tokens=None)

    def cancel(self) -> None:
        self.engine.cancel(self)


class LiveEngine:
    """Requests through one continuous batch on a thread of its own (module docstring)."""

    def __init__(self, tts, width: int = LIVE_WIDTH, max_frames: int = LIVE_MAX_FRAMES,
                 max_prompt: int = LIVE_MAX_PROMPT, max_waiting: int | None = None, who: str = "Serve",
                 kv_cache_bytes: int | None = None, on_fatal: Callable[[EngineFailed], None] | None = None):
        """kv_cache_bytes: the talker's keys and values in a paged pool of that size (rows join while their pages
        can be set aside; the paged batch has run on a GPU, the live engine on it not yet), else each of the `width`
        rows holds its whole capacity. on_fatal(error): once, on the engine's thread, when the engine has failed
        (module docstring)."""
        if not runs_lean(tts):
            raise ValueError(f"{who}: the live engine runs the continuous batch, which runs the lean layers; load "
                             "the model with mode fused, graphs or lean (eager runs static batches only)")
        self.tts, self.width, self.who = tts, width, who
        self.max_frames, self.max_prompt = max_frames, max_prompt
        self.need = max_prompt + max_frames + 1
        self.max_waiting = 4 * width if max_waiting is None else max_waiting
        self.count_tokens = token_count(tts, private=True)  # a text's tokens, on any thread
        self.pages = budget_pages(tts, kv_cache_bytes)
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._waiting: collections.deque[tuple[Row, int, Request]] = collections.deque()  # rows, in order
        self._rows: dict[Row, Request] = {}  # the rows in the batch (prefilled or live)
        self._cancels: set[Request] = set()  # requests cancelled while their rows are in the batch
        self._calls: collections.deque = collections.deque()  # (function, future): model work for this thread
        self._runner: RowRunner | None = None
        self._closed = False
        self.failure: EngineFailed | None = None
        self.on_fatal = on_fatal
        self.live_rows = self.cache_slots = 0  # as the engine's thread last saw them
        self.row_seconds = 5.0  # a row's time in the batch, averaged as rows end (for Busy's retry_after)
        self._joined: dict[Row, float] = {}
        self._thread = threading.Thread(target=self._serve, name="morph-live-engine", daemon=True)
        self._thread.start()

    # -- the callers' side (any thread) ------------------------------------------------------
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
        for r in rows:
            tokens = prompt_tokens(r.text, r.line.voice, r.line.instruct, self.count_tokens)
            if tokens > self.max_prompt:
                raise ValueError(f"{who}: the prompt takes {tokens} tokens (text of up to {MAX_SEGMENT_CHARS} "
                                 f"characters a segment, and the voice's reference), over this server's "
                                 f"{self.max_prompt}; use a shorter reference clip or transcript")
        request = Request(rid, rows, stream_keys(rows, settings.seed), settings, on_chunk, on_end, self)
        request.audio = LineAudio(rows, 1, on_line=lambda i, whole: self._end(request, None),
                                  on_chunk=lambda i, wav: self._hand(request, wav), streamed=True)
        with self._cv:
            self._check_open(who)
            excess = len(self._waiting) + len(rows) - self.max_waiting
            if excess > 0:  # a slot frees about every row_seconds / width: the queue has room once `excess` have
                wait = min(RETRY_AFTER_MAX_S, max(1, math.ceil(excess * self.row_seconds / self.width)))
                raise Busy(f"{who}: {len(self._waiting)} rows are waiting, the most this server queues is "
                           f"{self.max_waiting}; try again in {wait} s", wait)
            self._waiting.extend((r, k, request) for r, k in zip(rows, request.keys, strict=True))
            self._cv.notify()
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request: its waiting rows go, its rows in the batch end at the next frame, nothing more is handed."""
        with self._cv:
            if request.state not in ("waiting", "running"):
                return
            request.state = "cancelled"
            self._waiting = collections.deque(w for w in self._waiting if w[2] is not request)
            if any(self._rows.get(r) is request for r in request.rows):
                self._cancels.add(request)

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        """Run fn() on the engine's thread, between two frames or while it idles, and return its future: other model
        work (making a voice) never runs beside the batch's, whose CUDA graph captures another thread's work could
        break."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._check_open(self.who)
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def stats(self) -> dict:
        """What the engine holds now."""
        with self._cv:  # the frame's figures hold while rows are in the batch: once it is empty they are stale
            held = bool(self._rows)
            return dict(rows_live=self.live_rows if held else 0, rows_waiting=len(self._waiting),
                        rows_in_batch=len(self._rows), width=self.width, cache_slots=self.cache_slots if held else 0)

    def abort(self, error: BaseException) -> None:
        """End every request now, waiting or in the batch, with `error` (their rows leave the batch at its next
        frame), and the calls not yet run."""
        with self._cv:
            held = dict.fromkeys([w[2] for w in self._waiting] + list(self._rows.values()))
            self._waiting.clear()
            self._cancels.update(r for r in held if r.state == "running")
            calls, self._calls = list(self._calls), collections.deque()
        for _, future in calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        for request in held:
            self._end(request, error)

    def close(self, timeout: float | None = None) -> None:
        """Stop the engine's thread once its batch has drained, waiting at most `timeout` seconds for it (a thread
        still running then is left behind: it does not keep the process alive); requests still waiting end with an
        error."""
        with self._cv:
            self._closed = True
            left = [w[2] for w in self._waiting]
            self._waiting.clear()
            calls, self._calls = list(self._calls), collections.deque()
            self._cv.notify()
        for _, future in calls:
            future.set_exception(RuntimeError(f"{self.who}: the engine was closed"))
        for request in dict.fromkeys(left):
            self._end(request, RuntimeError(f"{self.who}: the engine was closed before this request ran"))
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
            self._run()
        except BaseException as e:  # the thread ends: nothing will run the requests any more
            self._fail(e)

    def _run(self) -> None:
        device = self.tts.device
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            while True:
                with self._cv:
                    while not (self._waiting or self._calls or self._closed):
                        self._cv.wait()
                self._run_calls()
                with self._cv:
                    if not self._waiting:
                        if self._closed:
                            return
                        continue
                    key = self._waiting[0][2].batch_key
                try:
                    if self._runner is None or self._runner.settings != key:
                        self._runner = None  # the old batch's state and graphs go before the new one's are made
                        self._runner = RowRunner(self.tts, key, self.width, self.need, lambda row: row.limit,
                                                 self._row_done, on_chunk=self._chunk, pages=self.pages)
                    self._runner.run(lambda n: self._take(key, n), self._between)
                except BaseException as e:  # the batch's state is unknown: the next burst builds a new one
                    self._runner = None
                    if fatal(e):
                        raise
                    self._batch_failed(e)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()

    def _batch_failed(self, error: BaseException) -> None:
        """A batch failed and the CUDA context survived: its requests fail, but out of memory, where the batch narrows
        to half its width and the rows that have handed out no audio go back to the front of the queue
        (BatchTTS.render's back-off)."""
        oom = isinstance(error, torch.cuda.OutOfMemoryError)
        with self._cv:
            held = dict.fromkeys(self._rows.values())
            width = self.width  # what the batch allocates for, however many rows it held
            self._rows.clear()
            self._joined.clear()
            again = []
            narrower = back_off(width) if oom else None
            if narrower is not None:
                self.width = narrower
                for request in list(held):
                    todo = request.audio.todo(request.rows)
                    if request.state == "running" and request.audio.restart(todo):
                        queued = {w[0] for w in self._waiting if w[2] is request}
                        again += [(r, k, request) for r, k in zip(request.rows, request.keys, strict=True)
                                  if r in todo and r not in queued]
                        held.pop(request)
                self._waiting.extendleft(reversed(again))
            failed = set(held)
            self._waiting = collections.deque(w for w in self._waiting if w[2] not in failed)
        if narrower is not None:
            log.warning("%s: out of GPU memory with %d rows in the batch; %d rows run again in a batch of at most %d "
                        "(set --batch-size %d to start there)", self.who, width, len(again), self.width, self.width)
        else:
            log.error("%s: the batch failed", self.who, exc_info=error)
        if oom:
            error = RuntimeError(f"{self.who}: the GPU ran out of memory ({reason(error)}) " + (
                "after this request's audio had begun; send it again" if narrower is not None else
                "in a batch of one row; send a shorter text or a lower max_new_tokens"))
        for request in held:
            self._end(request, error)

    def _fail(self, error: BaseException) -> None:
        """The engine cannot go on: every request it holds, and every one after, ends with EngineFailed."""
        log.critical("%s: the engine failed and cannot go on", self.who, exc_info=error)
        failure = EngineFailed(f"the speech engine failed ({reason(error)}) and cannot go "
                               "on; the process must be restarted")
        with self._cv:
            self.failure, self._closed = failure, True
        self.abort(failure)
        if self.on_fatal is not None:
            self.on_fatal(failure)

    def _take(self, key: GenerationSettings, n: int) -> list[tuple[Row, int]]:
        """Up to n waiting rows, in the order they came, while they sample as the batch does (a request with other
        settings stops the intake, so the batch drains and is built again for it)."""
        taken = []
        with self._cv:
            while self._waiting and len(taken) < n and self._waiting[0][2].batch_key == key:
                row, stream, request = self._waiting.popleft()
                request.state = "running"
                self._rows[row] = request
                self._joined[row] = time.perf_counter()
                taken.append((row, stream))
        return taken

    def _between(self, live: int) -> None:
        """Before each frame: the batch's live rows, and the rows of requests cancelled since the last frame."""
        self._run_calls()
        batch = self._runner.batch
        self.live_rows, self.cache_slots = live, sum(batch.position - row.lo for row in batch.live.values())
        with self._cv:
            if not self._cancels:
                return
            rows = {r for request in self._cancels for r in request.rows if r in self._rows}
            self._cancels.clear()
        self._runner.cancel(rows)
        running = {row.name for row in batch.live.values()}
        with self._cv:  # a row that had no slot yet is gone; a live one ends through _row_done
            for row in rows - running:
                self._rows.pop(row, None)
                self._joined.pop(row, None)

    def _run_calls(self) -> None:
        """The calls waiting for this thread."""
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

    def _chunk(self, row: Row, wav: np.ndarray) -> None:
        request = self._rows.get(row)
        if request is not None and request.state == "running":
            request.audio.chunks.chunk(row, wav)

    def _row_done(self, row: Row, wav: np.ndarray) -> None:
        with self._cv:
            request = self._rows.pop(row, None)
            started = self._joined.pop(row, None)
        if started is not None:
            self.row_seconds += 0.1 * (time.perf_counter() - started - self.row_seconds)
        if request is not None and request.state == "running":
            request.audio.deliver(row, wav)

    def _hand(self, request: Request, wav: np.ndarray) -> None:
        """A request's next audio (its line's, in order), to its caller; a callback that fails cancels it."""
        if request.state != "running":
            return
        try:
            request.on_chunk(wav)
        except Exception:
            log.exception("%s: request %d: on_chunk failed; the request is cancelled", self.who, request.id)
            self.cancel(request)

    def _end(self, request: Request, error: BaseException | None) -> None:
        with self._cv:
            if request.state in ("done", "failed"):
                return
            cancelled = request.state == "cancelled"
            request.state = "done" if error is None else "failed"
        if not cancelled:
            try:
                request.on_end(error)
            except Exception:  # a caller's callback must not stop the batch
                log.exception("%s: request %d: on_end failed", self.who, request.id)
