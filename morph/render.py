"""The batch front end every caller feeds. Rows run as one request to the engine, each drawing from its own random
stream so a seeded take does not depend on its batch; in eager mode in upstream's static batched generate, seeded per
batch as upstream does. Out of memory, rows not yet rendered retry at half the batch, down to one."""

from __future__ import annotations

import itertools
import logging
from typing import Callable, Generator, Iterator, Sequence

import numpy as np
import torch

from .codec.pieces import decode_rows
from .codec.stream import decode_whole
from .engine.engine import Engine, too_large
from .engine.request import rows_request
from .engine.scheduler import back_off
from .line_audio import LineAudio
from .lines.line import Line, Row
from .lines.voice import Voice
from .lines.words import FOR_PYTHON, Words
from .progress import SlotProgress
from .prompts import make_rows, prompt_inputs, token_count
from .settings import DEFAULT_BATCH_SIZE, RETIRED_BATCHING, GenerationSettings, runs_lean

log = logging.getLogger(__name__)

OnStep = Callable[[int, int], None]  # (done frame slots, total frame slots)
OnLine = Callable[[int, np.ndarray], None]  # (index into the lines given, float32 24 kHz audio)
OnChunk = Callable[[int, np.ndarray], None]  # (index into the lines given, the line's next float32 24 kHz audio)


def _allotment(rows: Sequence[Row]) -> int:
    return len(rows) * max(r.limit for r in rows)


class BatchTTS:
    """Renders lines on a loaded MorphTTS: the one caller of its model's generate (docs/architecture.md, Layers)."""

    def __init__(self, tts):
        self.tts = tts

    def render(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
               batch_size: int | None = DEFAULT_BATCH_SIZE, on_step: OnStep | None = None,
               on_line: OnLine | None = None, who: str = "Render lines", split_long_text: bool = True,
               sort: bool = True, labels: Sequence[str] | None = None, words: Words = FOR_PYTHON,
               on_chunk: OnChunk | None = None, kv_cache_bytes: int | None = None) -> list[np.ndarray]:
        """Speak every line, `batch_size` rows at a time (all when None): each line's float32 24 kHz audio, in order.
        on_line(i, audio) when line i is whole (kept if a later row fails); on_step(done, total) in frame slots each
        step and at the end (what it raises stops the render); on_chunk(i, audio) as it is made (eager: whole);
        kv_cache_bytes: a K/V pool of that size (not eager)."""
        results, frames = self.frames(lines, settings, batch_size, on_step, on_line, who, split_long_text, sort, labels,
                                      words, on_chunk, kv_cache_bytes)
        for _ in frames:
            pass
        return results

    def frames(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
               batch_size: int | None = DEFAULT_BATCH_SIZE, on_step: OnStep | None = None,
               on_line: OnLine | None = None, who: str = "Render lines", split_long_text: bool = True,
               sort: bool = True, labels: Sequence[str] | None = None, words: Words = FOR_PYTHON,
               on_chunk: OnChunk | None = None,
               kv_cache_bytes: int | None = None) -> tuple[list[np.ndarray], Iterator[None]]:
        """render with the lines checked now: (the list each line's audio goes into, the frames to run); closing the
        frames between two stops the render and releases the engine's state."""
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):  # True is no size
            raise ValueError(f"{who}: batch_size must be an integer >= 1, got {batch_size!r}; 64 suits most GPUs")
        settings = (settings or GenerationSettings()).validate(who)
        rows = make_rows(self.tts, lines, settings, who, split_long_text, labels, words)
        engine = runs_lean(self.tts)
        if kv_cache_bytes is not None and not engine:
            raise ValueError(f"{who}: kv_cache_bytes sizes the continuous batch's paged cache, which eager mode does "
                             "not run; set the speed mode to fused, graphs or lean, or leave kv_cache_bytes out")
        out = LineAudio(rows, len(lines), on_line, on_chunk, streamed=engine)
        return out.results, self._frames(rows, settings, batch_size, on_step, out, sort, who, kv_cache_bytes)

    def _frames(self, rows: list[Row], settings: GenerationSettings, batch_size: int | None, on_step: OnStep | None,
                out: LineAudio, sort: bool, who: str, kv_cache_bytes: int | None) -> Iterator[None]:
        if not rows:  # no line
            return
        cap = batch_size or len(rows)
        if runs_lean(self.tts):
            width = yield from self._engine(rows, settings, cap, on_step, who, out.deliver,
                                            None if out.chunks is None else out.chunks.chunk, out.restart,
                                            kv_cache_bytes)
        else:
            width = self._static_backing_off(rows, settings, cap, on_step, out, sort, who)
        if batch_size is not None and width < min(batch_size, len(rows)):
            log.warning("%s: finished with batches of at most %d rows after running out of GPU memory at %d; "
                        "set batch_size to %d to skip the failed attempts next time", who, width, batch_size, width)

    def codes(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
              on_step: OnStep | None = None, who: str = "Render lines", batch_size: int | None = None,
              kv_cache_bytes: int | None = None) -> list[torch.Tensor]:
        """The codes [frames, 16] of each line, in order, without the codec. Every line must fit one pass (at most
        MAX_SEGMENT_CHARS characters); in eager mode with batch_size None, one batched generate."""
        settings = (settings or GenerationSettings()).validate(who)
        rows = make_rows(self.tts, lines, settings, who, split_long_text=False)
        if not rows:
            return []
        out: list[torch.Tensor | None] = [None] * len(rows)
        width = batch_size or len(rows)
        if runs_lean(self.tts):
            for _ in self._engine(rows, settings, width, on_step, who, lambda r, c: out.__setitem__(r.index, c),
                                  kv_cache_bytes=kv_cache_bytes, audio=False):
                pass
            return out
        for start in range(0, len(rows), width):
            chunk = rows[start:start + width]
            out[start:start + width] = self._generate(chunk, settings, SlotProgress(on_step, _allotment(chunk)))
        return out

    def decode(self, codes: Sequence[torch.Tensor], voices: Sequence[Voice | None]) -> list[np.ndarray]:
        """Audio of each row's codes (voices[i]: its Voice or None), as upstream's generate_* decode them, in codec
        calls of bounded size: the lean codec, or upstream's in eager mode. A row without frames is silent."""
        refs = [None if v is None else v.ref_code for v in voices]
        if not runs_lean(self.tts):
            return decode_rows(self.tts.tts.model.speech_tokenizer, codes, refs)
        return decode_whole(self.tts.codec, codes, refs, self.tts.device)

    def check(self, lines: Sequence[Line], settings: GenerationSettings, who: str,
              labels: Sequence[str] | None = None) -> None:
        """Refuse a line this model cannot speak, as render would before any work."""
        make_rows(self.tts, lines, settings.validate(who), who, True, labels)

    def stop(self, row: Row) -> int:
        """The frame a row ends at the latest (a benchmark on random weights ends rows where speech would)."""
        return row.limit

    def _engine(self, rows: list[Row], settings: GenerationSettings, width: int, on_step: OnStep | None, who: str,
                on_row: Callable[[Row, object], None], on_chunk: Callable[[Row, np.ndarray], None] | None = None,
                restart: Callable[[Sequence[Row]], bool] = lambda rows: True, kv_cache_bytes: int | None = None,
                audio: bool = True) -> Generator[None, None, int]:
        """The rows as one request to an engine of `width` slots; raises its error, returns the width it ended at."""
        engine = Engine(self.tts, min(width, len(rows)), who, kv_cache_bytes=kv_cache_bytes,
                        overcommit=on_chunk is None, ahead=True, stop=self.stop, audio=audio)
        request = engine.submit(rows_request(rows, settings, token_count(self.tts), on_row, lambda error: None,
                                             on_chunk, restart))
        progress = SlotProgress(on_step, sum(r.limit for r in rows))
        try:
            while engine.step():
                progress.report(progress.done + engine.live_rows)
                yield
        finally:
            engine.release()
        if request.error is not None:
            raise request.error
        progress.finish()
        return engine.width if engine.backoffs else width

    def _static_backing_off(self, rows: list[Row], settings: GenerationSettings, cap: int, on_step: OnStep | None,
                            out: LineAudio, sort: bool, who: str) -> int:
        """Static batches of at most `cap` rows, halved after running out of memory; returns the final width."""
        pending = rows
        while True:
            pending = out.todo(pending)
            if not pending:
                return cap
            try:
                self._static(pending, settings, cap, on_step, out.deliver, sort)
                return cap
            except torch.cuda.OutOfMemoryError as e:
                error = e.with_traceback(None)  # the failed attempt's tensors go before the cache is emptied
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            width = min(cap, len(pending))
            cap = back_off(width)
            if cap is None:
                raise RuntimeError(too_large(pending[0], error))
            log.warning("%s: out of GPU memory with a batch of %d rows; retrying in batches of %d", who, width, cap)

    def _static(self, rows: list[Row], settings: GenerationSettings, width: int, on_step: OnStep | None,
                deliver, sort: bool) -> None:
        """Batches of like length, longest first (when `sort`), each decoded by upstream's codec after it."""
        planned = [[rows[i] for i in batch]
                   for batch in plan_batches([(r.limit, r.text) for r in rows], width, sort)]
        progress = SlotProgress(on_step, sum(_allotment(b) for b in planned))
        for batch in planned:
            start = progress.done
            codes = self._generate(batch, settings, progress)
            for row, wav in zip(batch, self.decode(codes, [r.line.voice for r in batch]), strict=True):
                deliver(row, wav)
            progress.done = start + _allotment(batch)  # rows that ended early leave the rest of it unused
        progress.finish()

    def _generate(self, rows: list[Row], settings: GenerationSettings,
                  progress: SlotProgress) -> list[torch.Tensor]:
        """One batched upstream generate with the morph patch; codes [frames, 16] per row, cut to its limit."""
        model = self.tts.tts
        longest = max(rows, key=lambda r: r.limit)
        kwargs = model._merge_generate_kwargs(**settings.upstream_kwargs(longest.text))
        inputs = prompt_inputs(self.tts, rows)
        on_step = None
        if progress.on_step is not None:
            base, width, step = progress.done, len(rows), itertools.count(1)
            on_step = lambda: progress.report(base + width * next(step))  # noqa: E731
        with self.tts.patch.call(settings.seq_groups, on_step, [self.stop(r) for r in rows], settings.min_new_tokens):
            if settings.seed is not None:
                torch.manual_seed(settings.seed)
            codes, _ = model.model.generate(languages=[r.line.language for r in rows], **inputs, **kwargs)
        return [c[: r.limit] for c, r in zip(codes, rows, strict=True)]


def retired_batching(batching: str, who: str) -> None:
    """The retired `batching` of Render Lines and cli.py render, still checked for one release."""
    if batching not in RETIRED_BATCHING:
        raise ValueError(f"{who}: batching must be one of {', '.join(RETIRED_BATCHING)}, got {batching!r}")
    if batching == "static":
        log.warning("%s: batching 'static' is retired and goes in the next release: every speed mode but eager "
                    "renders in the continuous batch, and eager (the exact reference) in static batches; this render "
                    "runs as its speed mode does", who)


def plan_batches(shapes: Sequence[tuple[int, str]], size: int, longest_first: bool = True) -> list[list[int]]:
    """Batches of at most `size` indices into `shapes` ((limit, text) a row), longest first unless told otherwise."""
    order = sorted(range(len(shapes)), key=lambda i: (-shapes[i][0], -len(shapes[i][1]))) if longest_first else \
        list(range(len(shapes)))
    return [order[s:s + size] for s in range(0, len(order), size)]
