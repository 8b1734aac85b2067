"""The batch loop every front end feeds: every line, alone or in a script, is a row of a batch.

    batch = BatchTTS(tts)                                   # tts: a loaded MorphTTS
    lines = [Line("Hello there.", alice, "English"), Line("Hi!", bob, "English"), ...]
    audio = batch.render(lines, GenerationSettings(seq_groups=5, seed=1), batch_size=16,
                         on_step=progress, on_line=save_one)  # float32 24 kHz arrays, in order

`MorphTTS.clone`, `custom_voice` and `voice_design` render one line: validation, splitting, seeding, progress,
out-of-memory handling and decoding are here only, and only this module sets the patch's per-call inputs
(seq_groups, on_step). A text over MAX_SEGMENT_CHARS is split at sentence ends into rows of the same render, and
joined again with SEGMENT_PAUSE_SECONDS of silence.

A batch builds its prompt inputs as upstream's generate_voice_clone, generate_custom_voice and
generate_voice_design do and runs upstream's batched `Qwen3TTSForConditionalGeneration.generate`
once (left-padded prompts, each row stopped at its own EOS); the morph decode answers inside it
through the model's patch. The codec decodes the batch's rows in pieces of bounded size (morph/codec.py), so its
memory does not grow with the batch. A finished row keeps its slot until its batch ends, so rows are sorted by
frame limit, longest first. Each row keeps its own frame limit: the batch runs to the largest and cuts each row.

Seeds: one per generate call. `torch.manual_seed(settings.seed)` runs right before every batched generate (retries
included), which makes a batch of one single-segment line upstream's generate_* seeded the same way, bit for bit
(tests/morph/test_exactness.py). All rows of a batch draw from that stream, so with sampling a row's take depends on
its companions and position (a long line's segments are not each restarted from the seed); `seed=None` reseeds none.

Batch invariance (greedy, fp32, CPU; tests/morph/test_scheduler.py): a row never sees its companions' data (for a
fixed batch shape and row position its logits are bit-identical whatever they hold), but the shape changes the low
bits (GEMM reduction order depends on M; left padding shifts keys across SIMD lanes; CPU sdpa depends on the row
index). Bit-identical rows across shapes would need per-row GEMVs and attention, that is, no batching; the
differences are about 1e-7 on logits of order 1, so greedy codes agree unless two tokens are that close. The batched
codec decode is the same: a row differs from its decode alone by rounding (about 5e-7 on samples in [-1, 1]) and is
bit-identical to upstream decoding the same rows together (on CUDA the codec's activation is the fused kernel of
morph/kernels/snake.py, which matches upstream's to rounding).

Out of memory (generation, a CUDA graph capture or the codec): the batch is retried as two halves (logged) and later
batches keep the smaller size, down to one row; a row that does not fit alone is a RuntimeError that names the node
and what to change.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .codec import decode_rows
from .lines.text_split import MAX_SEGMENT_CHARS, split_text
from .lines.voice import Voice, check_voice_fits
from .settings import SAMPLE_RATE, GenerationSettings

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16
SEGMENT_PAUSE_SECONDS = 0.2  # between the segments of a long text
OnStep = Callable[[int, int], None]  # (done frame slots, total frame slots)
OnLine = Callable[[int, np.ndarray], None]  # (index into the lines given, float32 24 kHz audio)


@dataclass(frozen=True)
class Line:
    """One text of upstream's generate_*, in its language: by a Voice (Base model; x-vector and ICL
    mix freely), a built-in speaker with an optional instruct (CustomVoice), or an instruct alone
    (VoiceDesign)."""

    text: str
    voice: Voice | None = None
    language: str = "Auto"
    speaker: str | None = None
    instruct: str = ""

    @property
    def variant(self) -> str:
        """The model variant this line needs."""
        if self.voice is not None:
            return "base"
        return "voice_design" if self.speaker is None else "custom_voice"


@dataclass(frozen=True)
class _Row:
    """One row of a batch: a line, or one segment of a line too long for one pass."""

    index: int  # into the lines given
    segment: int
    text: str
    line: Line
    where: str  # the node, and which line, for messages
    limit: int  # the most frames of this row alone (max_new_tokens)


class _Progress:
    """Frame slots across all batches of one render: a decode step of a batch of B rows is B slots,
    and a batch's allotment is B x its frame limit, the frames it may decode. Finished rows
    still take their slot in the batch, so slots measure the work actually done."""

    def __init__(self, on_step: OnStep | None, total: int):
        self.on_step, self.total, self.done = on_step, max(int(total), 1), 0

    def report(self, value: int) -> None:
        self.done = min(max(self.done, int(value)), self.total)
        if self.on_step is not None:
            self.on_step(self.done, self.total)


def _allotment(rows: Sequence[_Row]) -> int:
    return len(rows) * max(r.limit for r in rows)


class BatchTTS:
    """Renders lines on a loaded engine, any number at once. The engine (morph/engine.py's MorphTTS) comes in
    as an object: it imports this module, never the other way round. Only this class drives its patch."""

    def __init__(self, tts):
        self.tts = tts

    # -- public API -----------------------------------------------------------------
    def render(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
               batch_size: int | None = DEFAULT_BATCH_SIZE, on_step: OnStep | None = None,
               on_line: OnLine | None = None, who: str = "Render lines", split_long_text: bool = True,
               sort: bool = True, labels: Sequence[str] | None = None) -> list[np.ndarray]:
        """Speak every line; returns float32 24 kHz audio per line, in the order given.

        Rows (lines and segments) are rendered `batch_size` at a time, all at once when None
        (longest first when `sort`). `on_line(i, audio)` is called as soon as line i is complete,
        before the next batch starts, so a caller can keep finished lines when a later batch fails
        or is cancelled. `on_step(done, total)` is called before every decode step with frame slots
        across the whole render (see `_Progress`); an exception raised there (a cancel) stops the
        render and propagates. Messages name line i as `labels[i]`, as "line i+1" when there are
        several lines and no labels, and a single line not at all.
        """
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):  # True is no size
            raise ValueError(f"{who}: batch_size must be an integer >= 1, got {batch_size!r}; 16 suits most GPUs")
        settings = (settings or GenerationSettings()).validate(who)
        rows = self._rows(lines, settings, who, split_long_text, labels)
        if not rows:
            return []
        cap = batch_size or len(rows)
        planned = [[rows[i] for i in batch] for batch in plan_batches([(r.limit, r.text) for r in rows], cap, sort)]
        progress = _Progress(on_step, sum(_allotment(b) for b in planned))

        parts = {i: [None] * n for i, n in Counter(r.index for r in rows).items()}  # each line's segments
        results: list[np.ndarray | None] = [None] * len(lines)
        for batch in planned:
            start, pending = progress.done, batch
            while pending:
                chunk, pending = pending[:cap], pending[cap:]
                audio = self._attempt(chunk, settings, progress)
                if audio is None:  # out of memory: halve and go on at that size
                    cap = (len(chunk) + 1) // 2
                    log.warning("%s: out of GPU memory with a batch of %d rows; retrying in batches of %d",
                                who, len(chunk), cap)
                    pending = chunk + pending
                    continue
                for row, wav in zip(chunk, audio):
                    parts[row.index][row.segment] = wav
                    if all(part is not None for part in parts[row.index]):
                        results[row.index] = join_with_pauses(parts.pop(row.index))
                        if on_line is not None:
                            on_line(row.index, results[row.index])
            progress.done = start + _allotment(batch)  # rows that ended early leave the rest of it unused
        if batch_size is not None and cap < batch_size:
            log.warning("%s: finished with batches of at most %d rows after running out of GPU memory at %d; "
                        "set batch_size to %d to skip the failed attempts next time", who, cap, batch_size, cap)
        return results

    def codes(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
              on_step: OnStep | None = None, who: str = "Render lines") -> list[torch.Tensor]:
        """The codec codes [frames, 16] of each line from ONE batched generate, rows in the order given.
        Every line must fit one pass (at most MAX_SEGMENT_CHARS characters)."""
        settings = (settings or GenerationSettings()).validate(who)
        rows = self._rows(lines, settings, who, split_long_text=False)
        return self._generate(rows, settings, _Progress(on_step, _allotment(rows))) if rows else []

    def decode(self, codes: Sequence[torch.Tensor], voices: Sequence[Voice | None]) -> list[np.ndarray]:
        """Audio of each row's codes (voices[i]: row i's Voice, None without one), as upstream's generate_*
        decode a batch (an ICL voice's reference codes in front of its row, their audio cut off again), in
        codec calls of bounded size (morph/codec.py). A row without frames is silent."""
        refs = [None if v is None else v.ref_code for v in voices]
        return decode_rows(self.tts.tts.model.speech_tokenizer, codes, refs)

    def check(self, lines: Sequence[Line], settings: GenerationSettings, who: str,
              labels: Sequence[str] | None = None) -> None:
        """Refuse a line this model cannot speak (as render would, before any work), naming it as labels do."""
        self._rows(lines, settings.validate(who), who, True, labels)

    # -- checks and rows --------------------------------------------------------------
    def _rows(self, lines: Sequence[Line], settings: GenerationSettings, who: str, split_long_text: bool,
              labels: Sequence[str] | None = None) -> list[_Row]:
        rows = []
        for i, line in enumerate(lines):
            where = f"{who} ({labels[i]})" if labels else f"{who} (line {i + 1})" if len(lines) > 1 else who
            if not isinstance(line, Line):
                raise TypeError(f"{where}: expected a morph.scheduler.Line, got {type(line).__name__}")
            self._check(line, who, where)
            text = line.text.strip()
            pieces = split_text(text, MAX_SEGMENT_CHARS) if len(text) > MAX_SEGMENT_CHARS else [text]
            if len(pieces) > 1 and not split_long_text:
                raise ValueError(f"{where}: the text is {len(text)} characters, over the {MAX_SEGMENT_CHARS}-character "
                                 "limit of one segment; turn on split_long_text or shorten the text")
            if len(pieces) > 1:
                log.info("%s: a %d-character text is rendered as %d segments", where, len(text), len(pieces))
            rows += [_Row(i, s, piece, line, where, settings.frame_limit(piece)) for s, piece in enumerate(pieces)]
        return rows

    def _check(self, line: Line, who: str, where: str) -> None:
        tts = self.tts
        tts.require_variant(line.variant, who)
        if not isinstance(line.text, str) or not line.text.strip():
            raise ValueError(f"{where}: text is empty; type the words to speak")
        if not isinstance(line.language, str) or line.language.lower() not in {x.lower() for x in tts.languages}:
            raise ValueError(f"{where}: language {line.language!r} is not supported by this model; "
                             f"choose one of {', '.join(tts.languages)}")
        if line.variant == "base":
            check_voice_fits(line.voice, tts.hidden_size, tts.model_size, where)
            ref_text = line.voice.ref_text
            # the text to speak and the reference transcript are easy to swap, and a swap fails silently
            if ref_text and " ".join(ref_text.split()).lower() == " ".join(line.text.split()).lower():
                log.warning("%s: the text to speak is the same as the voice's transcript; if they were swapped, "
                            "put the words of the reference clip in the Voice prompt's transcript", where)
        if line.variant == "custom_voice" and str(line.speaker).lower() not in {s.lower() for s in tts.speakers}:
            raise ValueError(f"{where}: unknown speaker {line.speaker!r}; this model has {', '.join(tts.speakers)}")

    # -- one batch ---------------------------------------------------------------------
    def _attempt(self, rows: list[_Row], settings: GenerationSettings, progress: _Progress) -> list[np.ndarray] | None:
        """The rows' audio, or None when the GPU ran out of memory (progress rewound, cache emptied);
        a single row that does not fit is an error."""
        base = progress.done
        try:
            return self.decode(self._generate(rows, settings, progress), [r.line.voice for r in rows])
        except torch.cuda.OutOfMemoryError as e:
            oom = str(e).splitlines()[0] if str(e) else "CUDA out of memory"
        # Outside the except block, so the failed attempt's tensors (held by the traceback) are
        # already released when the cache is emptied.
        progress.done = base
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(rows) == 1:
            row = rows[0]
            raise RuntimeError(
                f"{row.where}: the GPU ran out of memory rendering a single row ({len(row.text)} characters, up to "
                f"{row.limit} frames): {oom}; free VRAM (ComfyUI's Unload models), set max_new_tokens lower, "
                "shorten the text, or load the model in bf16")
        return None

    def _generate(self, rows: list[_Row], settings: GenerationSettings, progress: _Progress) -> list[torch.Tensor]:
        """One batched upstream generate with the morph patch; codes [frames, 16] per row, cut to its limit."""
        model = self.tts.tts
        longest = max(rows, key=lambda r: r.limit)
        kwargs = model._merge_generate_kwargs(**settings.upstream_kwargs(longest.text))
        inputs = self._prompt_inputs(rows)
        patch = self.tts.patch
        patch.seq_groups = settings.seq_groups
        if progress.on_step is not None:
            base, width, step = progress.done, len(rows), itertools.count(1)
            patch.on_step = lambda: progress.report(base + width * next(step))
        try:
            if settings.seed is not None:
                torch.manual_seed(settings.seed)
            codes, _ = model.model.generate(languages=[r.line.language for r in rows], **inputs, **kwargs)
        finally:
            patch.on_step = None
        return [c[: r.limit] for c, r in zip(codes, rows)]

    def _prompt_inputs(self, rows: list[_Row]) -> dict:
        """What upstream's generate_voice_clone, generate_custom_voice or generate_voice_design passes
        to model.generate besides the languages and sampling settings, built the way they build it."""
        model, variant = self.tts.tts, rows[0].line.variant
        inputs = dict(input_ids=model._tokenize_texts([model._build_assistant_text(r.text) for r in rows]))
        if variant == "base":
            items = [self.tts._prompt_item(r.line.voice) for r in rows]
            return dict(inputs, voice_clone_prompt=model._prompt_items_to_voice_clone_prompt(items),
                        ref_ids=[model._tokenize_texts([model._build_ref_text(it.ref_text)])[0] if it.ref_text
                                 else None for it in items],
                        non_streaming_mode=False)
        # upstream drops the instruct for 0.6B CustomVoice models, which were trained without one
        drop = variant == "custom_voice" and self.tts.model_size == "0b6"
        instructs = ["" if drop else r.line.instruct.strip() for r in rows]
        inputs.update(instruct_ids=[model._tokenize_texts([model._build_instruct_text(t)])[0] if t else None
                                    for t in instructs], non_streaming_mode=True)
        if variant == "custom_voice":
            inputs["speakers"] = [r.line.speaker for r in rows]
        return inputs


def plan_batches(shapes: Sequence[tuple[int, str]], size: int, longest_first: bool = True) -> list[list[int]]:
    """Batches of at most `size` rows, as indices into `shapes` (each row's frame limit and text), longest first
    unless told otherwise: a batch runs to its longest row, so rows of like length go together."""
    order = sorted(range(len(shapes)), key=lambda i: (-shapes[i][0], -len(shapes[i][1]))) if longest_first else \
        list(range(len(shapes)))
    return [order[s:s + size] for s in range(0, len(order), size)]


def join_with_pauses(pieces: list[np.ndarray]) -> np.ndarray:
    """The segments of one long text, in order, with a short pause between each two."""
    pause = np.zeros(int(SEGMENT_PAUSE_SECONDS * SAMPLE_RATE), np.float32)
    return np.concatenate([part for piece in pieces for part in (pause, piece)][1:])
