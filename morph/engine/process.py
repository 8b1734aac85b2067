"""The server's engine in a process of its own, so the HTTP process never holds the GIL its frame loop needs
(docs/architecture.md, Threads and CUDA streams). The child is spawned (a fork after torch ran would copy its locks and
CUDA state) and made by `load` (picklable). Callbacks run on the parent's reader thread and must not block. When the
child ends, all it held ends with EngineFailed and on_exit(error) tells the owner, which may start() again."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
from typing import Callable

from ..errors import EngineFailed, reason
from ..lines.voice import read_voice, voice_bytes

log = logging.getLogger(__name__)

SPAWN = multiprocessing.get_context("spawn")
FATAL_EXIT = 3  # the child's status when its engine failed and cannot go on
STOP_S = 5  # after close's timeout: for the child to exit before it is terminated, then killed
SWITCH_INTERVAL_S = 0.0005  # Python's default is 0.005


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the HTTP process knows of the child's model."""
    source: str
    variant: str
    speakers: list[str]
    languages: list[str]
    model_size: str
    ready_s: float | None = None  # how long LiveEngine.ready took (None: nothing to capture)


def make_voice(tts, *args, **kwargs) -> bytes:
    """`call`'s model work for a voice: MorphTTS.make_voice in the child, as its file's bytes."""
    return voice_bytes(tts.make_voice(*args, **kwargs))


class EngineProcess:
    """The proxy of an engine in a child process, with LiveEngine's interface (a voice goes as its file's bytes: the
    parent imports no torch). options: LiveEngine's keywords."""

    def __init__(self, load: Callable[[], object], options: dict,
                 on_exit: Callable[[EngineFailed], None] | None = None):
        self.load, self.options, self.on_exit = load, options, on_exit
        self.max_frames = options["max_frames"]
        self.info: ModelInfo | None = None
        self._lock, self._send_lock = threading.Lock(), threading.Lock()
        self._held: dict[int, tuple[Callable, Callable]] = {}  # request id: (on_chunk, on_end)
        self._pending: dict[int, concurrent.futures.Future] = {}  # ask id: its future
        self._ids = itertools.count(1)
        self._conn = self._process = self._reader = None  # the child, and the thread that reads it and reaps it
        self._closed = False

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def start(self) -> ModelInfo:
        """Start a child and wait for its model to load; EngineFailed if it ends first."""
        parent, child = SPAWN.Pipe()
        process = SPAWN.Process(target=_serve, args=(self.load, self.options, child), name="morph-engine", daemon=True)
        loaded: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("serve: the engine has been closed")
            self._pending[0] = loaded
            self._conn, self._process = parent, process  # what is sent meanwhile waits in the pipe
            self._reader = threading.Thread(target=self._read, args=(parent, process, loaded),
                                            name="morph-engine-reader", daemon=True)
        process.start()
        child.close()  # the child's end lives in the child alone: its exit is this end's EOF
        self._reader.start()
        self.info = loaded.result()
        ready = "" if self.info.ready_s is None else (f", its kernels compiled and its batch captured in "
                                                      f"{self.info.ready_s:.1f} s before the first request")
        log.info("serve: the engine's process %d is up%s", process.pid, ready)
        return self.info

    def submit(self, line, settings, on_chunk: Callable, on_end: Callable, who: str | None = None
               ) -> concurrent.futures.Future:
        """Queue a request in the child (a voice as its file's bytes); the future is its id once taken (else Busy,
        ValueError, EngineFailed). on_chunk and on_end as LiveEngine's."""
        rid = next(self._ids)
        with self._lock:
            self._held[rid] = (on_chunk, on_end)
        future = self._ask("submit", rid, line, settings, who)
        future.add_done_callback(lambda f: f.exception() is None or self._held.pop(rid, None))
        return future

    def cancel(self, rid: int) -> None:
        """Stop a request: nothing more is handed, its rows leave the child's batch at its next frame."""
        with self._lock:
            self._held.pop(rid, None)
        try:
            self._send("cancel", 0, rid)
        except EngineFailed:  # the child is gone, and the request with it
            pass

    def call(self, fn: Callable, *args, **kwargs) -> concurrent.futures.Future:
        """fn(tts, *args, **kwargs) on the child's engine thread, between frames (fn picklable, its result too)."""
        return self._ask("call", fn, args, kwargs)

    def count_tokens(self, text: str) -> concurrent.futures.Future:
        return self._ask("tokens", text)

    def stats(self) -> dict:
        """What the child's engine holds now (EngineFailed while no child runs)."""
        return self._ask("stats").result(10)

    def abort(self, error: BaseException) -> None:
        """End every request held now with `error`; their rows leave the child's batch."""
        with self._lock:
            held, self._held = self._held, {}
        for rid, (_, on_end) in held.items():
            self.cancel(rid)
            on_end(error)

    def close(self, timeout: float) -> None:
        """Drain the child's batch for at most `timeout` s and stop it: terminated after STOP_S more, then killed."""
        with self._lock:
            self._closed = True
            process, reader = self._process, self._reader
        if process is None:
            return
        try:
            self._send("close", 0, timeout)
        except EngineFailed:
            pass
        # The reader alone waits for the child's exit: a second thread's join could lose the race for its exit
        # status, return at once and see the reaped child as alive.
        reader.join(timeout + STOP_S)
        for stop in (process.terminate, process.kill):
            if reader.is_alive():
                log.warning("serve: the engine's process %d has not stopped; %s", process.pid, stop.__name__)
                stop()
                reader.join(STOP_S)

    def _ask(self, kind: str, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        key = next(self._ids)
        with self._lock:
            self._pending[key] = future
        try:
            self._send(kind, key, *args)
        except EngineFailed as e:
            with self._lock:
                self._pending.pop(key, None)
            future.set_exception(e)
        return future

    def _send(self, *message) -> None:
        with self._send_lock:
            conn = self._conn
            try:
                if conn is None:
                    raise OSError("no engine process runs")
                conn.send(message)
            except OSError as e:
                raise EngineFailed(f"serve: the speech engine's process is not running ({e}); it is being "
                                   "restarted") from None

    def _read(self, conn, process, loaded: concurrent.futures.Future) -> None:
        """The parent's reader thread: the child's events, then its end."""
        cause = None
        try:
            while True:
                kind, key, *rest = conn.recv()
                if kind == "chunk":
                    entry = self._held.get(key)
                    if entry is not None:
                        entry[0](rest[0])
                elif kind == "end":
                    with self._lock:
                        entry = self._held.pop(key, None)
                    if entry is not None:
                        entry[1](rest[0])
                elif kind == "result":
                    with self._lock:
                        future = self._pending.pop(key, None)
                    if future is not None:
                        ok, value = rest
                        future.set_result(value) if ok else future.set_exception(value)
                else:  # "fatal": why the child is about to exit
                    cause = key
        except (EOFError, OSError):  # the child ended
            pass
        was_up = loaded.done() and loaded.exception() is None  # else start() raises the failure
        process.join(STOP_S)
        code = process.exitcode
        if cause is None:
            cause = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
                     else f"exit status {code}")
        error = EngineFailed(f"the speech engine's process ended ({cause}); it is being restarted")
        with self._lock:
            held, self._held = self._held, {}
            pending, self._pending = self._pending, {}
            if self._process is process:
                self._conn = None
            conn.close()
            announce = self._process is process and not self._closed
        for _, on_end in held.values():
            on_end(error)
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        if was_up and announce:
            log.error("serve: %s", error)
            if self.on_exit is not None:
                self.on_exit(error)


def _leave(code: int) -> None:
    """End the child now: teardown would wait on a failed CUDA context and on the libraries' threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(load: Callable[[], object], options: dict, conn) -> None:
    """The child's main thread: load the model, run LiveEngine, answer the parent's records until it closes or goes."""
    from .thread import LiveEngine

    # The engine's thread gives up the GIL at every CUDA wait (a frame's flags, a graph's replay); the thread reading
    # the pipe may then hold it for Python's whole switch interval before handing it back: a frame lost each time.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    outbox: queue.SimpleQueue = queue.SimpleQueue()  # records for the parent, in order; None ends the sender

    def send(*message) -> None:  # never blocks: the engine's thread must not wait for a full pipe
        outbox.put(message)

    def sending() -> None:
        while (message := outbox.get()) is not None:
            try:
                conn.send(message)
            except OSError:  # the parent went away: the loop below sees the pipe's end and stops the engine
                pass
    sender = threading.Thread(target=sending, name="morph-engine-sender", daemon=True)
    sender.start()

    def reply(key: int, future: concurrent.futures.Future) -> None:
        error = future.exception()
        send("result", key, error is None, _portable(error) if error is not None else future.result())

    def failed(error: EngineFailed) -> None:  # on the engine's thread, every request it held ended with `error`
        send("fatal", str(error))
        outbox.put(None)
        sender.join(STOP_S)  # the requests' ends, then why, reach the parent before the exit
        _leave(FATAL_EXIT)

    held: dict = {}  # request id: the engine's Request
    try:
        tts = load()
        engine = LiveEngine(tts, **options, who="serve", on_fatal=failed)
        ready_s = engine.ready()  # before the parent hears the model is loaded: /health says ok only once it is
    except BaseException as e:  # the parent's start() raises it
        send("result", 0, False, EngineFailed(f"the speech engine's process could not start: {reason(e)}"))
        outbox.put(None)
        sender.join(STOP_S)
        raise
    send("result", 0, True, ModelInfo(str(tts.source), tts.variant, list(tts.speakers), list(tts.languages),
                                      tts.model_size, ready_s))
    while True:
        try:
            kind, key, *args = conn.recv()
        except EOFError:  # the parent went away
            engine.close(STOP_S)
            _leave(0)
        if kind == "close":
            engine.close(args[0])
            outbox.put(None)
            sender.join(STOP_S)
            _leave(0)
        if kind == "cancel":
            request = held.pop(args[0], None)
            if request is not None:
                engine.cancel(request)
            continue
        done: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if kind == "submit":
                rid, line, settings, who = args
                if line.voice is not None:
                    line = dataclasses.replace(line, voice=read_voice(line.voice, who or "serve", "the voice"))

                def ended(error, rid=rid) -> None:
                    held.pop(rid, None)
                    send("end", rid, None if error is None else _portable(error))
                held[rid] = engine.submit(line, settings, lambda wav, rid=rid: send("chunk", rid, wav), ended, who)
                done.set_result(rid)
            elif kind == "call":
                fn, fn_args, fn_kwargs = args
                done = engine.call(lambda fn=fn, a=fn_args, kw=fn_kwargs: fn(tts, *a, **kw))
            elif kind == "tokens":
                done.set_result(engine.tokenizer.count(args[0]))
            else:  # "stats"
                done.set_result(engine.stats())
        except Exception as e:  # the request's or the ask's own error, for the parent to raise
            done = concurrent.futures.Future()
            done.set_exception(e)
        done.add_done_callback(lambda f, key=key: reply(key, f))


def _portable(error: BaseException) -> BaseException:
    """`error` as the parent can unpickle it (its class and message), else a RuntimeError naming it."""
    try:
        copy = pickle.loads(pickle.dumps(error))
        if type(copy) is type(error) and str(copy) == str(error):
            return error
    except Exception:  # an exception class whose arguments do not round-trip
        pass
    return RuntimeError(reason(error))
