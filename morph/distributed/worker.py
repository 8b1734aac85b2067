"""One worker of a distributed script job, a threaded Ray actor per GPU: a model loaded once, and an engine on its own
thread fed one request a planned batch, IN_FLIGHT at a time so the continuous batch never empties between two. A
call waits for its request, then writes its lines' files; only (script index, file written) go back to the driver."""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable, Sequence

import numpy as np

from ..api import MorphTTS
from ..engine.engine import Engine
from ..engine.request import rows_request
from ..engine.thread import EngineThread
from ..line_audio import LineAudio
from ..lines.store import LineFiles, Written
from ..lines.voice import Voice
from ..prompts import PrivateTokenizer, make_rows
from ..render import BatchTTS, Line
from ..script_job import job_context
from ..settings import GenerationSettings, runs_lean


class LineWorker:
    def __init__(self, load: dict):
        import transformers

        # this process is the job's own: transformers' per-load bars would only repeat through Ray's log
        transformers.utils.logging.disable_progress_bar()
        self.tts = MorphTTS.load(**load)
        self.tts.ready(who="Ray worker")  # batches of up to the default size capture nothing after it
        self.count_tokens = PrivateTokenizer(self.tts).count  # on Ray's threads, beside the engine's
        self._engine: EngineThread | None = None  # built for the first continuous batch, kept for the next
        self._width = 0  # the width it was built for (it narrows after running out of memory)
        self._lock = threading.Lock()  # model work on Ray's threads (static batches, voices): one call at a time

    def about(self) -> dict:
        """What the driver checks and reports: the model kind, where it runs, and which process this is."""
        return dict(variant=self.tts.variant, device=str(self.tts.device), host=socket.gethostname(), pid=os.getpid())

    def context(self, language: str, settings: GenerationSettings, smoothing: bool) -> dict:
        return job_context(self.tts.config, language, settings, smoothing)

    def voice_from_clip(self, clip: np.ndarray, transcript: str | None, who: str) -> Voice:
        return self._model_work(lambda: self.tts.voice_from_clip(clip, transcript, who=who))

    def check(self, lines: Sequence[Line], settings: GenerationSettings, who: str, labels: Sequence[str]) -> None:
        BatchTTS(self.tts).check(lines, settings, who, labels)

    def render(self, batch: Sequence[tuple[int, str, Line]], files: LineFiles, settings: GenerationSettings,
               finish_line: Callable[[np.ndarray], np.ndarray] | None, who: str, labels: Sequence[str],
               width: int) -> list[tuple[int, Written]]:
        """One planned batch of (script index, character name, line): one request to the engine of `width` slots, or
        in eager mode one static batch; writes each line's file and returns (script index, the file written)."""
        lines = [line for _, _, line in batch]
        if runs_lean(self.tts):
            audio = self._request(lines, settings, who, labels, width)
        else:
            with self._lock:
                audio = BatchTTS(self.tts).render(lines, settings, batch_size=len(batch), who=who, sort=False,
                                                  labels=labels)
        done = []
        for (index, name, _), wav in zip(batch, audio, strict=True):
            wav = finish_line(wav) if finish_line is not None else wav
            done.append((index, files.write_line(index + 1, name, wav)))
        return done

    def _request(self, lines: list[Line], settings: GenerationSettings, who: str, labels: Sequence[str],
                 width: int) -> list[np.ndarray]:
        """The lines' audio, through the worker's engine behind the batches sent before."""
        settings = settings.validate(who)
        rows = make_rows(self.tts, lines, settings, who, True, labels)
        out = LineAudio(rows, len(lines), None, None, streamed=False)
        ended = threading.Event()
        request = rows_request(rows, settings, self.count_tokens, out.deliver, lambda error: ended.set())
        self._engine_of(width, who).submit(request, who)
        ended.wait()
        if request.error is not None:
            raise request.error
        return out.results

    def _engine_of(self, width: int, who: str) -> EngineThread:
        with self._lock:
            if self._engine is None or self._width != width:
                if self._engine is not None:
                    self._engine.close()
                self._engine = EngineThread(Engine(self.tts, width, who, overcommit=True, ahead=True))
                self._width = width
            return self._engine

    def _model_work(self, fn: Callable[[], object]):
        """fn() on the engine's thread once there is one (model work beside its batch could break a capture)."""
        with self._lock:
            engine = self._engine
            if engine is None:
                return fn()
        return engine.call(fn).result()
