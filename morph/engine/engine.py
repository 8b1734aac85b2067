"""The engine: requests in (`submit`), their audio out through each request's sink, one continuous batch run a frame per
`step()` on the thread that owns the model (docs/architecture.md, Data flow). Rows run in order; one with other settings
or a larger cache need waits for a batch built for it. Out of memory, the batch narrows by half and the rows that handed
out no audio run again (others fail); an error that loses the CUDA context (`fatal`) propagates; any other fails the
batch's requests and the engine goes on."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

import torch

from .runner import RowRunner, budget_pages
from ..errors import reason
from ..lines.line import Row
from ..memory import batch_need, free_bytes
from ..settings import GenerationSettings, pool_pages, requeue_pool_pages, runs_lean
from .request import CANCELLED, DONE, FAILED, RUNNING, WAITING, Request
from .scheduler import Pace, back_off, fits_batch, fitting_width

log = logging.getLogger(__name__)

# What torch's errors say when the CUDA context is lost: nothing more can run in this process.
FATAL_WORDS = ("CUDA error", "device-side assert", "illegal memory access")


def allocated(device: torch.device) -> int:
    """torch's allocated bytes on a CUDA device: what an engine's runs leave kept is its rise."""
    return torch.cuda.memory_allocated(device)


def fatal(error: BaseException) -> bool:
    """Whether an error leaves the CUDA context unusable (out of memory does not)."""
    return not isinstance(error, torch.cuda.OutOfMemoryError) and any(w in str(error) for w in FATAL_WORDS)


class Engine:
    """Requests through one continuous batch. `ahead`: prompts built on a worker thread (for rows nobody cancels one
    by one); `overcommit`: the pool may preempt a row that streams nothing, to run it again; `stop(row)`: a row's last
    frame at the latest; `audio` False: on_row gets each row's codes and no codec runs."""

    def __init__(self, tts, width: int, who: str, need: tuple[int, int] | None = None,
                 kv_cache_bytes: int | None = None, overcommit: bool = False, ahead: bool = False,
                 stop: Callable[[Row], int] | None = None, audio: bool = True):
        if not runs_lean(tts):
            raise ValueError(f"{who}: the engine runs the continuous batch, which runs the lean layers; load the "
                             "model with mode fused, graphs or lean (eager runs upstream's static batches only)")
        self.tts, self.width, self.who, self.need = tts, width, who, need
        self.kv_cache_bytes, self.overcommit, self.ahead, self.audio = kv_cache_bytes, overcommit, ahead, audio
        self.stop = stop or (lambda row: row.limit)
        self.cv = threading.Condition()  # guards what callers on other threads touch: the queue, rows, cancels
        self._waiting: collections.deque[tuple[Row, int, Request]] = collections.deque()  # rows, in order
        self._rows: dict[Row, Request] = {}  # the rows in the batch (taken, prefilled or live)
        self._cancels: set[Request] = set()  # requests cancelled while their rows are in the batch
        self._runner: RowRunner | None = None
        self._built: tuple[GenerationSettings, int, int] | None = None  # the runner's settings, cache need, prompt
        self._running = False  # the runner is in a run: rows are in its batch or joining
        self._began: int | None = None  # on a GPU, its allocated bytes when this engine's first run began
        self._joined: dict[Row, float] = {}
        self.row_seconds = 5.0  # a row's time in the batch, averaged as rows end (a server's Retry-After)
        self.backoffs = 0  # times the batch narrowed after running out of memory (not before it was built: _fit)
        self.live_rows = self.cache_slots = 0  # as the loop last saw them
        self.pace = Pace() if need is not None else None  # a live batch's figures, kept from one batch to the next

    # -- the callers' side (any thread) ------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queue a request's rows behind those waiting; its sink is called as they run."""
        entries = list(zip(request.rows, request.keys, [request] * len(request.rows), strict=True))  # before any queues
        with self.cv:
            request.status = WAITING
            self._waiting.extend(entries)
            self.cv.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request: its rows end by the next frame, nothing more is handed and its on_end is not called."""
        with self.cv:
            if request.status not in (WAITING, RUNNING):
                return
            request.status = CANCELLED
            self._drop(request)

    def abort(self, error: BaseException, held: bool = True) -> None:
        """End every request with rows waiting now with `error`, and with `held` those in the batch too."""
        with self.cv:
            ended = dict.fromkeys([w[2] for w in self._waiting] + (list(self._rows.values()) if held else []))
            for request in ended:
                self._drop(request)
        for request in ended:
            self._end(request, error)

    def waiting_rows(self) -> int:
        with self.cv:
            return len(self._waiting)

    def stats(self) -> dict:
        with self.cv:  # the frame's figures hold while rows are in the batch: once it is empty they are stale
            held = bool(self._rows)
            return dict(rows_live=self.live_rows if held else 0, rows_waiting=len(self._waiting),
                        rows_in_batch=len(self._rows), width=self.width, cache_slots=self.cache_slots if held else 0)

    # -- the loop (the thread that owns the model) -------------------------------------------
    def step(self) -> bool:
        """One frame of the batch, built first for the rows at the queue's head when it holds other settings or less
        cache; False once no row waits or runs. A caller that stops stepping mid-run calls release()."""
        while True:
            if not self._running:
                with self.cv:
                    if not self._waiting:
                        return False
                    row, _, request = self._waiting[0]
                    key, need, prompt = request.batch_key, request.needs[row], request.prompt_bounds[row]
                if self._runner is not None and not fits_batch(key, need, prompt, self._built):
                    self._runner = None  # the old batch's state and graphs go before the new one's are made
            failure = None
            if self._began is None and self.tts.device.type == "cuda":
                self._began = allocated(self.tts.device)
            try:
                if self._runner is None:
                    self._build(key)
                self._running = self._runner.step(self._take, self._before_frame, self._put_back, self.ahead)
                if self._running:
                    return True
            except BaseException as e:  # the batch's state is unknown: the next run builds a new one
                self._runner, self._running = None, False
                if fatal(e) or not isinstance(e, Exception):
                    raise
                failure = e
            if failure is not None:  # here, not in the except block, whose traceback holds the failed run's tensors
                oom = isinstance(failure, torch.cuda.OutOfMemoryError)
                self._failed(failure)
                failure = None
                if self.tts.device.type == "cuda":
                    if oom:  # the next batch is built narrower, in the memory the kept state held
                        self.tts.patch.loop.drop_state()
                        self.tts.held = 0
                        self._began = allocated(self.tts.device)
                    torch.cuda.empty_cache()

    def release(self) -> None:
        """Drop the batch now, its rows that ended handed over first: the runner's callbacks refer back to this engine,
        so only the collector would free it."""
        if self._running:
            self._runner.close()
        self._runner, self._running = None, False
        if self._began is not None:  # what its runs left allocated, the runner gone, is state the next batch reuses
            self.tts.held = max(0, self.tts.held + allocated(self.tts.device) - self._began)
            self._began = None

    def _build(self, key: GenerationSettings) -> None:
        """A batch for the rows of `key` waiting now, its need and pool sized to them unless `need` is fixed (live)."""
        with self.cv:
            rows = [(r, q) for r, _, q in self._waiting if q.batch_key == key]
        needs = [q.needs[r] for r, q in rows]
        need, prompt = self.need or (max(needs), max(q.prompt_bounds[r] for r, q in rows))
        if self.need is None:
            self._fit(rows)
        if self.kv_cache_bytes is not None:
            pages = budget_pages(self.tts, self.kv_cache_bytes)
        elif self.need is not None:
            pages = None  # a live batch: every slot holds a whole row's cache
        elif self.overcommit:  # sized for the frames rows are likely to speak: one the pool cannot grow runs again
            pages = requeue_pool_pages([(q.prompt_bounds[r], r.limit) for r, q in rows], self.width)
        else:
            pages = pool_pages(needs, self.width)
        self._runner = RowRunner(self.tts, key, self.width, need, prompt, self.stop, self._row_done, self.audio,
                                 self._chunk, pages, self.overcommit, self.pace)
        self._built = (key, need, prompt)

    def _fit(self, rows: list[tuple[Row, Request]]) -> None:
        """Narrow a render's batch, before it is built, to the width the free memory holds (memory.batch_need)."""
        free = free_bytes(self.tts.device)
        if free is None:
            return
        # what the engine kept since ready() this batch reuses or replaces: the budget stays the one it had at load
        free += self.tts.held
        prompts = [q.prompt_bounds[r] for r, q in rows]
        width = fitting_width(self.width, lambda w: batch_need(self.tts, [r for r, _ in rows], prompts, w), free)
        if width < self.width:
            log.warning("%s: %.2f GiB of GPU memory is free, enough for a batch of %d rows, not %d; rendering %d "
                        "at a time", self.who, free / 2**30, width, self.width, width)
            self.width = width

    def _take(self, n: int) -> list[tuple[Row, int]]:
        """Up to n waiting rows, in order, while they fit the batch."""
        taken = []
        with self.cv:
            while self._waiting and len(taken) < n:
                row, stream, request = self._waiting[0]
                if not fits_batch(request.batch_key, request.needs[row], request.prompt_bounds[row], self._built):
                    break
                self._waiting.popleft()
                request.status = RUNNING
                self._rows[row] = request
                self._joined[row] = time.perf_counter()
                taken.append((row, stream))
        return taken

    def _put_back(self, taken: tuple[Row, int]) -> None:
        """A preempted row: first in the queue again."""
        row, stream = taken
        with self.cv:
            request = self._rows.pop(row)
            self._joined.pop(row, None)
            if request.status == RUNNING:
                self._waiting.appendleft((row, stream, request))

    def _before_frame(self, live: int) -> None:
        """Before each frame: the batch's figures, and the rows of requests cancelled since the last frame."""
        batch = self._runner.batch
        self.live_rows, self.cache_slots = live, sum(batch.position - row.lo for row in batch.live.values())
        with self.cv:
            rows = {r for request in self._cancels for r in request.rows if r in self._rows}
            self._cancels.clear()
        if rows:
            self._runner.cancel(rows)
            running = {row.name for row in batch.live.values()}
            with self.cv:  # a row that had no slot yet is gone; a live one ends through _row_done
                for row in rows - running:
                    self._rows.pop(row, None)
                    self._joined.pop(row, None)

    def _chunk(self, row: Row, wav) -> None:
        request = self._rows.get(row)
        if request is not None and request.status == RUNNING and request.on_chunk is not None:
            self._call(request, request.on_chunk, row, wav)

    def _row_done(self, row: Row, out) -> None:
        with self.cv:
            request = self._rows.pop(row, None)
            started = self._joined.pop(row, None)
        if started is not None:
            self.row_seconds += 0.1 * (time.perf_counter() - started - self.row_seconds)
        if request is None or request.status != RUNNING:
            return
        request.done.add(row)
        if self._call(request, request.on_row, row, out) and len(request.done) == len(request.rows):
            self._end(request, None)

    def _call(self, request: Request, sink: Callable, *args) -> bool:
        """A request's sink; one that fails ends the request with its error (the batch goes on)."""
        try:
            sink(*args)
            return True
        except Exception as e:
            with self.cv:
                self._drop(request)
            self._end(request, e)
            return False

    def _drop(self, request: Request) -> None:
        """(under cv) The request's waiting rows go; those in the batch end at the next frame."""
        self._waiting = collections.deque(w for w in self._waiting if w[2] is not request)
        if any(self._rows.get(r) is request for r in request.rows):
            self._cancels.add(request)

    def _failed(self, error: Exception) -> None:
        """A batch failed and the CUDA context survived (module docstring)."""
        oom = isinstance(error, torch.cuda.OutOfMemoryError)
        narrower = back_off(self.width) if oom else None
        with self.cv:
            held = dict.fromkeys(self._rows.values())
            if not held and narrower is None and self._waiting:
                # the batch failed before it took a row (while it was built): the request it was built for fails, or
                # the next run would build it again for ever
                held = {self._waiting[0][2]: None}
            self._rows.clear()
            self._joined.clear()
            again = []
            if narrower is not None:
                for request in list(held):
                    todo = request.todo
                    if request.status == RUNNING and request.restart(todo):
                        queued = {w[0] for w in self._waiting if w[2] is request}
                        again += [(r, k, request) for r, k in zip(request.rows, request.keys, strict=True)
                                  if r in todo and r not in queued]
                        held.pop(request)
                self._waiting.extendleft(reversed(again))
            for request in held:
                self._drop(request)
        if narrower is not None:
            log.warning("%s: out of GPU memory with a batch of %d rows; retrying in batches of %d (%d rows run "
                        "again)", self.who, self.width, narrower, len(again))
            self.width = narrower
            self.backoffs += 1
        elif not oom:
            log.error("%s: the batch failed", self.who, exc_info=error)
        for request in held:
            self._end(request, _out_of_memory(request, error, narrower is None) if oom else error)

    def _end(self, request: Request, error: BaseException | None) -> None:
        with self.cv:
            if request.status in (DONE, FAILED):
                return
            cancelled = request.status == CANCELLED
            request.status, request.error = (DONE, None) if error is None else (FAILED, error)
        if not cancelled:
            try:
                request.on_end(error)
            except Exception:  # a caller's callback must not stop the batch
                log.exception("%s: request %d: on_end failed", self.who, request.id)


def _out_of_memory(request: Request, error: BaseException, alone: bool) -> RuntimeError:
    """Alone: which row does not fit; else, that its audio had begun and a retry would hand it again."""
    if alone:
        return RuntimeError(too_large((request.todo or request.rows)[0], error))
    return RuntimeError(f"{request.rows[0].where}: the GPU ran out of memory ({reason(error)}) after this request's "
                        "audio had begun, which a retry would hand out again; send it again, or set the batch size "
                        "lower")


def too_large(row: Row, error: BaseException) -> str:
    """A row that ran out of memory alone in its batch: which, and what to change."""
    return (f"{row.where}: the GPU ran out of memory rendering a single row ({len(row.text)} characters, up to "
            f"{row.limit} frames): {reason(error)}; free VRAM (ComfyUI's Unload models), set max_new_tokens lower, "
            "shorten the text, or load the model in bf16")
