"""A script rendered into a folder the same way by every front end (docs/scripts.md): lines an earlier run left with the
same fingerprint are reused; the rest are each written once rendered, so a crash loses only lines in flight."""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .lines.script import ScriptLine
from .lines.files import LineWriteError, check_space, wav_header
from .lines.store import LineStore, Written, cues, fingerprint, join_clips, srt
from .lines.words import FOR_PYTHON, Words
from .render import BatchTTS, Line, OnLine, OnStep
from .settings import SAMPLE_RATE, GenerationSettings

if TYPE_CHECKING:
    from .config import ModelConfig

log = logging.getLogger(__name__)

ESTIMATE_CHARS_PER_SECOND = 15.0  # a line's speech for the disk check before it is rendered: brisk, so it errs low
RECORD_EVERY_S = 1.0  # how often the manifest takes the lines written since (_LineWriter)


@dataclass(frozen=True)
class ScriptResult:
    clips: list[np.ndarray]  # every line's audio, in script order
    subtitles: str  # SRT of the dialogue
    pause_seconds: float

    @property
    def dialogue(self) -> np.ndarray:
        """The lines joined with pauses, made only when asked, so the script's audio is not held twice."""
        return join_clips(self.clips, self.pause_seconds)[0]


def job_context(config: ModelConfig, language: str, settings: GenerationSettings, smoothing: bool) -> dict:
    """What decides a line's audio besides the line: the model `config`, every setting but the seed (so it resumes)."""
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k != "seed"}
    if fields["min_new_tokens"] == GenerationSettings.min_new_tokens:
        # left out at upstream's value, so that lines rendered before it was a setting keep their fingerprints
        del fields["min_new_tokens"]
    return dict(model=config.source, model_size=config.model_size, dtype=str(config.dtype),
                attention=config.attention, mode=config.mode, device=config.device.type, language=language,
                smoothing=bool(smoothing), settings=fields)


class ScriptJob:
    """`rerun` says, in the front end's words, how a user renders the rest after a stop."""

    def __init__(self, parsed: Sequence[ScriptLine], lines: Sequence[Line], store: LineStore, context: dict,
                 rerun: str = "run the job again"):
        self.parsed, self.lines, self.store, self.rerun = list(parsed), list(lines), store, rerun
        self.fingerprints = [fingerprint(context, p.name, line.text, line.voice, line.speaker, line.instruct)
                             for p, line in zip(self.parsed, self.lines)]
        self.audio: dict[int, np.ndarray] = {}  # script index -> audio, reused or rendered (in this process)
        self.lengths: dict[int, int] = {}  # script index -> samples of every line done, wherever it was rendered

    def reuse(self, keep_audio: bool = True) -> int:
        """Read back the lines an earlier run left with this fingerprint; returns how many. Without `keep_audio` (a
        job that joins its dialogue from the files) only their lengths are kept."""
        for i, p in enumerate(self.parsed):
            wav = self.store.load(i + 1, p.name, self.fingerprints[i])
            if wav is not None:
                self.lengths[i] = wav.size
                if keep_audio:
                    self.audio[i] = wav
        store, kept = self.store, len(self.lengths)
        why = [f"{n} {what}" for n, what in ((store.changed, "from another text, voice, model or settings"),
                                             (store.unrecorded, "written by a run that stopped before recording them"),
                                             (store.altered, "no longer the file that was recorded")) if n]
        if kept or why:  # one line, shown where the user looks (a status line), not one per file
            log.info("%s: %d of %d lines already rendered in %s%s; rendering %d", store.who, kept, len(self.lines),
                     store.folder, f" (rendering again: {', '.join(why)})" if why else "", len(self.lines) - kept,
                     extra={"status": True})
        return kept

    def todo(self) -> list[int]:
        return [i for i in range(len(self.lines)) if i not in self.lengths]

    def written(self, done: list[tuple[int, Written]]) -> None:
        """Lines whose files are written, as (script index, the file written): into the manifest, in one write."""
        self.store.record([(i + 1, self.parsed[i].name, self.parsed[i].text, self.fingerprints[i], file)
                           for i, file in done])
        self.lengths.update((i, file.samples) for i, file in done)

    def stopped(self, why: str) -> str:
        return (f"{why}; {len(self.lengths)} of {len(self.lines)} lines are kept in {self.store.folder}; "
                f"{self.rerun} to render the rest")

    def check_space(self, pause_seconds: float, dialogue: bool, words: Words = FOR_PYTHON) -> None:
        """Before the first line: refuse a job whose files (lines to render, and the dialogue if written) won't fit."""
        todo = self.todo()
        guess = {i: round(len(self.lines[i].text.strip()) / ESTIMATE_CHARS_PER_SECOND * SAMPLE_RATE) for i in todo}
        need = sum(len(wav_header(n)) + 4 * n for n in guess.values())
        if dialogue:
            pause = int(round(pause_seconds * SAMPLE_RATE))
            samples = sum(self.lengths.values()) + sum(guess.values()) + pause * max(len(self.lines) - 1, 0)
            need += len(wav_header(samples)) + 4 * samples
        check_space(self.store.folder, need, self.store.who, words.other_disk)

    def write_dialogue(self, pause_seconds: float):
        """`{prefix}.wav`, joined from the line files once every line is done; returns its path."""
        return self.store.join_lines([p.name for p in self.parsed], float(pause_seconds))

    def finish(self, pause_seconds: float) -> str:
        """The subtitles and the manifest of exactly this script, once every line is done; returns the SRT."""
        timed = cues([self.lengths[i] for i in range(len(self.lines))], float(pause_seconds))
        subtitles = srt([(start, end, p.name, p.text) for (start, end), p in zip(timed, self.parsed)])
        self.store.finish(len(self.lines), subtitles)
        return subtitles

    def run(self, prepare: Callable[[list[Line]], object], settings: GenerationSettings, batch_size: int,
            pause_seconds: float, finish_line: Callable[[np.ndarray], np.ndarray] | None = None,
            on_step: OnStep | None = None, on_line: OnLine | None = None, who: str = "Render lines",
            words: Words = FOR_PYTHON, dialogue: bool = False) -> ScriptResult:
        """Render the lines not reused, in this process, and write every file (`dialogue`: `{prefix}.wav` too);
        prepare(lines) returns the engine (not called if all are reused); on_line(i, audio) follows line i's file."""
        todo = self.todo()
        self.check_space(pause_seconds, dialogue, words)

        def finished(k: int, wav: np.ndarray, written: list[tuple[int, Written]]) -> None:
            i = todo[k]
            wav = finish_line(wav) if finish_line is not None else wav
            written.append((i, self.store.write_line(i + 1, self.parsed[i].name, wav)))  # kept if on_line raises
            self.audio[i] = wav
            if on_line is not None:
                on_line(i, wav)

        try:
            if todo:
                rendering = [self.lines[i] for i in todo]
                with _LineWriter(finished, self.written) as hand_over:
                    BatchTTS(prepare(rendering)).render(rendering, settings, batch_size=batch_size, on_step=on_step,
                                                        on_line=hand_over, who=who, labels=self.labels(todo),
                                                        words=words)
            clips = [self.audio[i] for i in range(len(self.lines))]
            if dialogue:
                self.write_dialogue(pause_seconds)
            return ScriptResult(clips, self.finish(pause_seconds), float(pause_seconds))
        except LineWriteError as e:
            raise LineWriteError(self.stopped(str(e))) from e

    def labels(self, indices: Sequence[int]) -> list[str]:
        return [f"script line {self.parsed[i].number}, {self.parsed[i].name}" for i in indices]


class _LineWriter:
    """Each line finished (smoothed, written) in order on a thread of its own, beside the render's frame loop, and
    recorded at most every RECORD_EVERY_S (the manifest is rewritten whole). A line that fails stops the render at
    its next line with that error; leaving the block waits for and records every line handed over."""

    def __init__(self, finish: Callable[[int, np.ndarray, list[tuple[int, Written]]], None],
                 record: Callable[[list[tuple[int, Written]]], None]):
        """finish(k, audio, written) appends (script index, file) once on disk; record(written) updates the manifest."""
        self.finish, self.record = finish, record
        self.error: BaseException | None = None
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._drain, name="morph-line-writer", daemon=True)

    def __enter__(self) -> Callable[[int, np.ndarray], None]:
        self.thread.start()
        return self.hand_over

    def hand_over(self, k: int, wav: np.ndarray) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put((k, wav))

    def _drain(self) -> None:
        written, last = [], -math.inf
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.finish(*item, written)
                except BaseException as e:  # handed to the render's thread: it raises it
                    self.error = e
                if time.monotonic() - last >= RECORD_EVERY_S:
                    self._record(written)
                    last = time.monotonic()
        self._record(written)

    def _record(self, written: list) -> None:
        """The lines written, into the manifest; a record that fails drops them (a rerun renders them again)."""
        if written:
            try:
                self.record(list(written))
            except BaseException as e:
                self.error = self.error or e
            written.clear()

    def __exit__(self, kind, value, traceback) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None and value is None:
            raise self.error
        if self.error is not None and value is not self.error:
            log.error("a line could not be finished after the render stopped: %s", self.error)
