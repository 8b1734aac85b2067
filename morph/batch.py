"""Batch rendering: many lines, each with its own text, voice and language, decoded together.

    batch = BatchTTS(tts)                                   # tts: a loaded MorphTTS
    lines = [Line("Hello there.", alice, "English"), Line("Hi!", bob, "English"), ...]
    audio = batch.render(lines, GenerationSettings(seq_groups=5, seed=1), batch_size=16,
                         on_step=progress, on_line=save_one)  # float32 24 kHz arrays, in order

How a batch runs. Rows (lines) go through upstream qwen-tts's own batched
`Qwen3TTSForConditionalGeneration.generate`, with the morph predictor attached (seam A;
seam B, when the model's patch provides one, is used the same way as for one line): each
row's prompt is built from its own text, voice (x-vector or ICL, mixed freely) and
language; prompts are left-padded with an attention mask, positions come from the mask,
each row reads its own trailing text, and HF generate stops each row at its own EOS.
Decoding is per line, exactly as `generate_voice_clone` decodes one line (ICL voices
decode reference + new codes and cut the reference part off).

What finished rows cost. A row that has reached EOS keeps its slot: every later step of
the batch still runs the talker and the code predictor over all B rows (HF feeds finished
rows a pad token and drops their frames), until every row is done or the batch's frame
limit is reached. To keep that waste small, `render` sorts lines by their frame limit
(which grows with the text's length), longest first, so rows of one batch tend to finish
together; longest first also means an out-of-memory shows up on the first batch.

Frame limits. Each row keeps its own bound (`max_new_tokens`, or the text-derived default):
the batch runs to the largest, and each row's codes are cut to its own bound, which gives
exactly the frames a single-line run with that bound gives (later frames never change
earlier ones).

Seeds. One seed per batch call: `torch.manual_seed(settings.seed)` right before each
batched generate, as `MorphTTS.clone` does before each single-line generate. Sampled
tokens of all rows come from one random stream (one multinomial over the whole batch per
step), so with sampling a line's audio depends on its batch companions and its row; it is
reproducible for the same script, settings and batch size. A batch of one is exactly
`MorphTTS.clone`. Greedy decoding has no such dependence (see below).

Batch invariance (greedy, fp32; measured on CPU with MKL, tests/morph/test_batch.py):
- A batch of one runs exactly the single-line computation: codes and audio are
  bit-identical to `MorphTTS.clone`.
- A row never sees its companions' data: for a fixed batch shape (batch size, padded
  prompt length) and row position, its logits are bit-identical whatever the other rows
  hold (texts, voices, x-vector or ICL, languages, EOS steps).
- The shape itself does change the low bits, and no choice of attention path fixes it:
  a GEMM's reduction order depends on its shape (MKL sgemm gives a row different bits at
  M=1, at M=2..3 and at M>=4, and a row's bits depend on its position at M=5..7 and 9,
  the remainder tiles; cuBLAS also picks kernels and split-K by M); left padding shifts
  the real keys across the SIMD lanes of the attention reductions (sdpa and eager
  alike); CPU sdpa's result also depends on the row's index in the batch. The attention
  mask is not a cause: an all-true boolean mask and `is_causal` give the same bits.
  Bit-identical rows across shapes would need per-row GEMVs and per-row attention, that
  is, no batching. The differences are rounding-level (about 1e-7 on logits of order 1):
  greedy codes agree unless two candidate tokens are that close.

Out of memory. A CUDA out-of-memory error retries the batch as two halves (logged), and
later batches of the same call keep the smaller size, down to one line; if one line alone
does not fit, a RuntimeError says so and what to change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import torch

from .engine import MorphTTS, join_with_pauses, warn_if_text_is_the_transcript
from .settings import SAMPLE_RATE, GenerationSettings
from .text_split import MAX_SEGMENT_CHARS, split_text
from .voice import Voice, check_voice_fits

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16
OnStep = Callable[[int, int], None]  # (done frame slots, total frame slots)
OnLine = Callable[[int, np.ndarray], None]  # (index into the lines given, float32 24 kHz audio)


@dataclass(frozen=True)
class Line:
    """One line to speak: its text, the voice that speaks it, and its language."""

    text: str
    voice: Voice
    language: str = "Auto"


@dataclass(frozen=True)
class _Row:
    """One row of a batch: a line, or one segment of a line too long for one pass."""

    line: int  # index into the lines given
    segment: int
    text: str
    voice: Voice
    language: str
    limit: int  # max_new_tokens of this row alone


class _Progress:
    """Frame slots across all batches of one render: each decode step of a batch of B rows
    is B slots, and a batch's allotment is B x (its frame limit - 1). Finished rows still
    take their slot in the batch, so slots measure the work actually done."""

    def __init__(self, on_step: OnStep | None, total: int):
        self.on_step, self.total, self.done = on_step, max(int(total), 1), 0

    def report(self, value: int) -> None:
        self.done = min(max(self.done, int(value)), self.total)
        if self.on_step is not None:
            self.on_step(self.done, self.total)


def _allotment(rows: Sequence[_Row]) -> int:
    return len(rows) * max(max(r.limit for r in rows) - 1, 1)


class BatchTTS:
    """Renders many lines at once on a loaded `MorphTTS` (Base model)."""

    def __init__(self, tts: MorphTTS):
        self.tts = tts

    # -- public API -----------------------------------------------------------------
    def render(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
               batch_size: int = DEFAULT_BATCH_SIZE, on_step: OnStep | None = None, on_line: OnLine | None = None,
               who: str = "Render lines", split_long_text: bool = True, sort: bool = True,
               labels: Sequence[str] | None = None) -> list[np.ndarray]:
        """Speak every line; returns float32 24 kHz audio per line, in the order given.

        Lines are rendered `batch_size` at a time (longest first when `sort`). `on_line(i, audio)`
        is called as soon as line i is complete, before the next batch starts, so a caller can
        keep finished lines when a later batch fails or is cancelled. `on_step(done, total)` is
        called before every decode step with frame slots across the whole render (see
        `_Progress`); an exception raised there (a cancel) stops the render and propagates.
        `labels[i]` names line i in error messages (default "line i+1").
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{who}: batch_size must be an integer >= 1, got {batch_size!r}; 16 suits most GPUs")
        settings = self._check(settings, who)
        rows = self._rows(lines, settings, who, split_long_text, labels)
        if not rows:
            return []
        order = sorted(range(len(rows)), key=lambda i: (-rows[i].limit, -len(rows[i].text), i)) if sort \
            else list(range(len(rows)))
        planned = [[rows[i] for i in order[s:s + batch_size]] for s in range(0, len(order), batch_size)]
        progress = _Progress(on_step, sum(_allotment(b) for b in planned))

        segments: dict[int, dict[int, np.ndarray]] = {}
        needed = {r.line: 0 for r in rows}
        for r in rows:
            needed[r.line] += 1
        results: list[np.ndarray | None] = [None] * len(lines)
        state = SimpleNamespace(cap=batch_size)
        for batch in planned:
            start = progress.done
            for row, audio in self._render_fitting(batch, settings, progress, state, who):
                segments.setdefault(row.line, {})[row.segment] = audio
                if len(segments[row.line]) == needed[row.line]:
                    parts = segments.pop(row.line)
                    results[row.line] = join_with_pauses([parts[s] for s in sorted(parts)])
                    if on_line is not None:
                        on_line(row.line, results[row.line])
            progress.report(start + _allotment(batch))
        if state.cap < batch_size:
            log.warning("%s: finished with batches of at most %d lines after running out of GPU memory at %d; "
                        "set batch_size to %d to skip the failed attempts next time", who, state.cap, batch_size,
                        state.cap)
        return results

    def codes(self, lines: Sequence[Line], settings: GenerationSettings | None = None,
              on_step: OnStep | None = None, who: str = "Render lines") -> list[torch.Tensor]:
        """The codec codes [frames, 16] of each line from ONE batched generate, rows in the order given.
        Every line must fit one pass (at most MAX_SEGMENT_CHARS characters)."""
        settings = self._check(settings, who)
        rows = self._rows(lines, settings, who, split_long_text=False)
        if not rows:
            return []
        progress = _Progress(on_step, _allotment(rows))
        return self._generate(rows, settings, progress)

    def decode(self, codes: Sequence[torch.Tensor], voices: Sequence[Voice]) -> list[np.ndarray]:
        """Audio of each row's codes, decoded one line at a time exactly as `generate_voice_clone` does."""
        return [self._decode_one(c, v) for c, v in zip(codes, voices)]

    # -- checks and rows --------------------------------------------------------------
    def _check(self, settings: GenerationSettings | None, who: str) -> GenerationSettings:
        self.tts.require_variant("base", who)
        return (settings or GenerationSettings()).validate(who)

    def _rows(self, lines: Sequence[Line], settings: GenerationSettings, who: str,
              split_long_text: bool, labels: Sequence[str] | None = None) -> list[_Row]:
        rows = []
        for i, line in enumerate(lines):
            where = f"{who} ({labels[i] if labels else f'line {i + 1}'})"
            if not isinstance(line, Line):
                raise TypeError(f"{where}: expected a morph.batch.Line, got {type(line).__name__}")
            if not isinstance(line.text, str) or not line.text.strip():
                raise ValueError(f"{where}: the text is empty; type the words to speak")
            check_voice_fits(line.voice, self.tts.hidden_size, self.tts.model_size, where)
            language = self.tts._check_language(line.language, where)
            text = line.text.strip()
            pieces = split_text(text, MAX_SEGMENT_CHARS) if len(text) > MAX_SEGMENT_CHARS else [text]
            if len(pieces) > 1 and not split_long_text:
                raise ValueError(f"{where}: the text is {len(text)} characters, over the {MAX_SEGMENT_CHARS}-character "
                                 "limit of one pass; split it into shorter lines")
            warn_if_text_is_the_transcript(text, line.voice.ref_text, where)
            for s, piece in enumerate(pieces):
                limit = settings.upstream_kwargs(piece)["max_new_tokens"]
                rows.append(_Row(i, s, piece, line.voice, language, limit))
        return rows

    # -- one batch ---------------------------------------------------------------------
    def _render_fitting(self, rows: list[_Row], settings: GenerationSettings, progress: _Progress,
                        state: SimpleNamespace, who: str):
        """Yield (row, audio) for every row, in batches of at most state.cap rows, halving on OOM."""
        s = 0
        while s < len(rows):
            chunk = rows[s:s + state.cap]
            base = progress.done
            oom = None
            try:
                codes = self._generate(chunk, settings, progress)
                audio = [self._decode_one(c, r.voice) for c, r in zip(codes, chunk)]
            except torch.cuda.OutOfMemoryError as e:
                oom = str(e).splitlines()[0] if str(e) else "CUDA out of memory"
            if oom is None:
                yield from zip(chunk, audio)
                s += len(chunk)
                continue
            # Retry outside the except block, so the failed attempt's tensors (held by the
            # traceback) are already released when the cache is emptied.
            codes = audio = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if len(chunk) == 1:
                raise RuntimeError(
                    f"{who}: the GPU ran out of memory rendering a single line ({len(chunk[0].text)} characters, "
                    f"up to {chunk[0].limit} frames): {oom}. No batch size fits; free VRAM (ComfyUI's Unload "
                    "models), load the model in bf16, shorten the line, or set max_new_tokens lower")
            state.cap = max(1, (len(chunk) + 1) // 2)
            log.warning("%s: out of GPU memory with a batch of %d lines; retrying in batches of %d",
                        who, len(chunk), state.cap)
            progress.done = base

    def _generate(self, rows: list[_Row], settings: GenerationSettings, progress: _Progress) -> list[torch.Tensor]:
        """One batched upstream generate with the morph patch; codes [frames, 16] per row, cut to its limit."""
        tts, model = self.tts, self.tts.tts
        items = [tts._prompt_item(r.voice) for r in rows]
        input_ids = model._tokenize_texts([model._build_assistant_text(r.text) for r in rows])
        # as generate_voice_clone: the transcript is tokenised whenever the item has one
        ref_ids = [model._tokenize_texts([model._build_ref_text(it.ref_text)])[0] if it.ref_text else None
                   for it in items]
        kwargs = model._merge_generate_kwargs(**settings.upstream_kwargs(rows[0].text))
        kwargs["max_new_tokens"] = max(r.limit for r in rows)

        base, width = progress.done, len(rows)
        steps = iter(range(1, kwargs["max_new_tokens"] + 1))
        patch = tts.patch
        patch.seq_groups = settings.seq_groups
        if progress.on_step is not None:
            patch.on_step = lambda: progress.report(base + width * next(steps, kwargs["max_new_tokens"]))
        try:
            if settings.seed is not None:
                torch.manual_seed(settings.seed)
            prompt = model._prompt_items_to_voice_clone_prompt(items)
            codes, _ = model.model.generate(input_ids=input_ids, ref_ids=ref_ids, voice_clone_prompt=prompt,
                                            languages=[r.language for r in rows], non_streaming_mode=False, **kwargs)
        finally:
            patch.on_step = None
        return [c[: max(r.limit - 1, 0)] for c, r in zip(codes, rows)]

    def _decode_one(self, codes: torch.Tensor, voice: Voice) -> np.ndarray:
        if codes.shape[0] == 0:
            return np.zeros(0, np.float32)
        tokenizer = self.tts.tts.model.speech_tokenizer
        if voice.ref_code is None:
            wavs, sr = tokenizer.decode([{"audio_codes": codes}])
            wav = wavs[0]
        else:
            ref = voice.ref_code.to(codes.device)
            wavs, sr = tokenizer.decode([{"audio_codes": torch.cat([ref, codes], dim=0)}])
            total = ref.shape[0] + codes.shape[0]
            wav = wavs[0][int(ref.shape[0] / max(total, 1) * wavs[0].shape[0]):]
        assert sr == SAMPLE_RATE, f"the 12 Hz codec decodes at {SAMPLE_RATE} Hz, got {sr}"
        return np.asarray(wav, dtype=np.float32)

