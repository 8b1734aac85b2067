"""Generation settings and the sizes the decode and morph/memory.py share; torch-free, so CLI help loads no engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

FRAMES_PER_SECOND = 12.5  # one codec frame per 80 ms
SAMPLE_RATE = 24000
DEFAULT_SEQ_GROUPS = 5
MAX_SEQ_GROUPS = 15
MODES = ("auto", "eager", "lean", "graphs", "fused")  # what MorphTTS.load and Load Model take (docs/architecture.md)
RETIRED_MODES = {"compile": "fused"}  # each run as the mode named

# A missed EOS must not run for minutes: slow speech runs about 3 characters a second, plus lead-in and silence.
SECONDS_PER_CHAR = 0.35
EXTRA_SECONDS = 5.0

RETIRED_BATCHING = ("continuous", "static")  # Render Lines' and `cli.py render`'s, still taken for one release
DEFAULT_BATCH_SIZE = 64  # the rows a render runs at once

LIVE_WIDTH = 16  # the slots of the live engine's batch (the server's); a row's bounds below size its cache
LIVE_MAX_FRAMES = 1024  # 82 s a row: a 500-character segment speaks in about 35 s; a missed EOS stops here
LIVE_MAX_PROMPT = 1023  # with LIVE_MAX_FRAMES and the EOS slot, 2,048 slots a row: a capacity of 4,096

MIN_CAPACITY = 256  # the fewest cache slots the decode's static state reserves per row


def capacity_for(needed: int) -> int:
    """Cache slots a row for `needed`: the next power of two (at least MIN_CAPACITY), so few graphs are captured."""
    return max(MIN_CAPACITY, 1 << (int(needed) - 1).bit_length())


def text_slots(prompt: int) -> int:
    """The continuous batch's text table slots a row: its trailing text (at most `prompt` tokens), then a pad."""
    return capacity_for(prompt + 1)


# The continuous batch's keys and values live in pages of KV_PAGE slots; a pool's size is rounded up to one of
# POOL_STEPS sizes an octave, so a kept state (and its CUDA graphs) serves the next render of about the same size.
KV_PAGE = 32  # to be measured on a GPU against the fused kernel's tiles (the torch path gathers whole rows)
POOL_STEPS = 8


def pool_pages(row_needs: Sequence[int], width: int) -> int:
    """Pages (the null page included) for a continuous batch of `width` slots whose rows need row_needs[i] cache slots
    each, and one more as they join: the `width` largest at once, each starting anywhere in a page."""
    largest = sorted(row_needs, reverse=True)[:max(1, int(width))]
    need = 1 + sum(-(-(int(n) + 1) // KV_PAGE) + 1 for n in largest)
    step = 1 << max(0, need.bit_length() - POOL_STEPS.bit_length())
    return -(-need // step) * step


# A render whose rows may be preempted (an overcommitted pool) sizes its pool for this share of each row's frame
# limit: speech ends at about a fifth of the text-derived limit, and a row the pool cannot grow starts again.
POOL_FRAME_SHARE = 0.25
# A group's prefill holds its keys, values and activations until its rows have joined, so rows are prefilled a slice
# of at most this many tokens at a time (at least one row), as serving engines bound a step's prefill tokens.
PREFILL_TOKENS = 2048
# In the fast modes a slice's prefill replays its bucket's CUDA graph (prefill_bucket); a longer prompt runs op by op.
PREFILL_LENGTHS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def prefill_bucket(rows: int, length: int) -> tuple[int, int] | None:
    """(rows, length) that a slice of `rows` prompts of `length` tokens is padded to; None past the longest length."""
    padded = next((b for b in PREFILL_LENGTHS if b >= length), None)
    return None if padded is None else (1 << (rows - 1).bit_length(), padded)


def prefill_rows(length: int) -> int:
    """The most prompts of `length` tokens in a slice: a power of two (1 at least) whose bucket fits PREFILL_TOKENS."""
    bucket = prefill_bucket(1, length)
    per = max(1, PREFILL_TOKENS // (length if bucket is None else bucket[1]))
    return 1 << (per.bit_length() - 1)


def requeue_pool_pages(rows: Sequence[tuple[int, int]], width: int) -> int:
    """Pages for a continuous batch of `width` slots whose rows, (prompt tokens, frame limit) each, may be preempted:
    the `width` largest at POOL_FRAME_SHARE of their frames, and never fewer than the largest row needs alone."""
    expected = [p + math.ceil(f * POOL_FRAME_SHARE) + 1 for p, f in rows]
    return max(pool_pages(expected, width), pool_pages([max(p + f + 1 for p, f in rows)], 1))


def runs_lean(tts, device=None) -> bool:
    """Whether `tts` runs the continuous batch (not eager) on `device` (None: its own; offloaded: where it returns)."""
    return tts.patch.resolved_mode(device or tts.device) != "eager"


def check_seq_groups(seq_groups, num_groups: int = MAX_SEQ_GROUPS, who: str = "morph") -> int:
    if isinstance(seq_groups, bool) or not isinstance(seq_groups, int) or not 1 <= seq_groups <= num_groups:
        raise ValueError(f"{who}: seq_groups must be an integer from 1 to {num_groups}, got {seq_groups!r}; "
                         f"use {num_groups} for upstream-exact output, or 5 (the default) for speed")
    return seq_groups


@dataclass(frozen=True)
class Sampling:
    """How the code predictor picks each codec token (upstream's `subtalker_*` settings)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0

    def validate(self, who: str = "Sampling") -> "Sampling":
        if not (self.temperature > 0):
            raise ValueError(f"{who}: temperature must be > 0, got {self.temperature}; use 1.0 for none")
        if int(self.top_k) < 0:
            raise ValueError(f"{who}: top_k must be >= 0, got {self.top_k}; use 0 to switch top-k off")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"{who}: top_p must be in (0, 1], got {self.top_p}; use 1.0 to switch top-p off")
        return self


def default_max_frames(text: str) -> int:
    """The frame limit used when the caller gives none: generous, but always bounded."""
    return int(math.ceil(FRAMES_PER_SECOND * (EXTRA_SECONDS + SECONDS_PER_CHAR * len(text.strip()))))


@dataclass(frozen=True)
class GenerationSettings:
    """Everything that shapes one generation, with upstream qwen-tts's defaults."""

    seq_groups: int = DEFAULT_SEQ_GROUPS
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker: Sampling = field(default_factory=Sampling)
    seed: int | None = None
    max_new_tokens: int | None = None  # None: default_max_frames(text)
    min_new_tokens: int = 2  # frames before EOS may be drawn (upstream's talker generate is given 2)

    def validate(self, who: str = "morph") -> "GenerationSettings":
        check_seq_groups(self.seq_groups, MAX_SEQ_GROUPS, who)
        Sampling(self.do_sample, self.temperature, self.top_k, self.top_p).validate(who)
        self.subtalker.validate(f"{who} (code predictor)")
        if not (self.repetition_penalty > 0):
            raise ValueError(f"{who}: repetition_penalty must be > 0, got {self.repetition_penalty}; 1.0 is none")
        if self.max_new_tokens is not None and int(self.max_new_tokens) < 1:
            raise ValueError(f"{who}: max_new_tokens must be >= 1, got {self.max_new_tokens}; "
                             "leave it out (None) for the automatic limit, which follows the text's length")
        # the first draw, from the prompt, is held back too: EOS there would leave a row no frame
        if isinstance(self.min_new_tokens, bool) or not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 1:
            raise ValueError(f"{who}: min_new_tokens must be an integer >= 1, got {self.min_new_tokens!r}; "
                             "use 2, upstream's, or more to hold the end of speech back longer")
        return self

    def frame_limit(self, text: str) -> int:
        return int(self.max_new_tokens or default_max_frames(text))

    def upstream_kwargs(self, text: str) -> dict:
        return dict(do_sample=self.do_sample, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    repetition_penalty=self.repetition_penalty, subtalker_dosample=self.subtalker.do_sample,
                    subtalker_temperature=self.subtalker.temperature, subtalker_top_k=self.subtalker.top_k,
                    subtalker_top_p=self.subtalker.top_p,
                    # upstream's max_new_tokens counts code-0 tokens, and the last one sampled never becomes a frame
                    max_new_tokens=self.frame_limit(text) + 1)
