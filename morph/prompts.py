"""From lines to what upstream's generate takes: checks, rows (a long text's segments), prompt inputs, and
each row's random stream key."""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import threading
from typing import Sequence

import torch

from .lines.line import Line, Row
from .lines.text_split import MAX_SEGMENT_CHARS, split_text
from .lines.voice import Voice, check_voice_fits
from .lines.words import FOR_PYTHON, Words
from .settings import GenerationSettings

log = logging.getLogger(__name__)

PROMPT_OVERHEAD_TOKENS = 32  # chat markup, codec control tokens, the speaker embedding
# Upstream's generate reads a voice's row (Base model, streaming mode) a text token a frame beside the codes: the talker
# prefills its markup and speaker (10 tokens at the 0.6B dims) and an ICL voice's reference frames, beside which the
# transcript and the text start.
VOICE_PREFILL_TOKENS = 16


def make_rows(tts, lines: Sequence[Line], settings: GenerationSettings, who: str, split_long_text: bool,
              labels: Sequence[str] | None = None, words: Words = FOR_PYTHON) -> list[Row]:
    """Every line checked (before any work), and split into rows where it is over MAX_SEGMENT_CHARS; messages word
    their fixes as `words` does."""
    rows = []
    for i, line in enumerate(lines):
        where = f"{who} ({labels[i]})" if labels else f"{who} (line {i + 1})" if len(lines) > 1 else who
        if not isinstance(line, Line):
            raise TypeError(f"{where}: expected a morph.render.Line, got {type(line).__name__}")
        check_line(tts, line, who, where, words)
        text = line.text.strip()
        pieces = split_text(text, MAX_SEGMENT_CHARS) if len(text) > MAX_SEGMENT_CHARS else [text]
        if len(pieces) > 1 and not split_long_text:
            raise ValueError(f"{where}: the text is {len(text)} characters, over the {MAX_SEGMENT_CHARS}-character "
                             "limit of one segment; turn on split_long_text or shorten the text")
        if len(pieces) > 1:
            log.info("%s: a %d-character text is rendered as %d segments", where, len(text), len(pieces))
        rows += [Row(i, s, piece, line, where, settings.frame_limit(piece)) for s, piece in enumerate(pieces)]
    return rows


def check_line(tts, line: Line, who: str, where: str, words: Words = FOR_PYTHON) -> None:
    """Refuse a line this model cannot speak, naming it as `where`."""
    tts.require_variant(line.variant, who)
    if not isinstance(line.text, str) or not line.text.strip():
        raise ValueError(f"{where}: text is empty; type the words to speak")
    if not isinstance(line.language, str) or line.language.lower() not in {x.lower() for x in tts.languages}:
        raise ValueError(f"{where}: language {line.language!r} is not supported by this model; "
                         f"choose one of {', '.join(tts.languages)}")
    if line.variant == "base":
        check_voice_fits(line.voice, tts.hidden_size, tts.model_size, where, words)
        ref_text = line.voice.ref_text
        # the text to speak and the reference transcript are easy to swap, and a swap fails silently
        if ref_text and " ".join(ref_text.split()).lower() == " ".join(line.text.split()).lower():
            log.warning("%s: the text to speak is the same as the voice's transcript; if they were swapped, "
                        "put the words of the reference clip in %s", where, words.transcript)
    if line.variant == "custom_voice" and str(line.speaker).lower() not in {s.lower() for s in tts.speakers}:
        raise ValueError(f"{where}: unknown speaker {line.speaker!r}; this model has {', '.join(tts.speakers)}")


def prompt_inputs(tts, rows: list[Row]) -> dict:
    """What upstream's generate_voice_clone, generate_custom_voice or generate_voice_design passes
    to model.generate besides the languages and sampling settings, built the way they build it."""
    model, variant = tts.tts, rows[0].line.variant
    inputs = dict(input_ids=model._tokenize_texts([model._build_assistant_text(r.text) for r in rows]))
    if variant == "base":
        items = [tts._prompt_item(r.line.voice) for r in rows]
        return dict(inputs, voice_clone_prompt=model._prompt_items_to_voice_clone_prompt(items),
                    ref_ids=[model._tokenize_texts([model._build_ref_text(it.ref_text)])[0] if it.ref_text
                             else None for it in items],
                    non_streaming_mode=False)
    # upstream drops the instruct for 0.6B CustomVoice models, which were trained without one
    drop = variant == "custom_voice" and tts.model_size == "0b6"
    instructs = ["" if drop else r.line.instruct.strip() for r in rows]
    inputs.update(instruct_ids=[model._tokenize_texts([model._build_instruct_text(t)])[0] if t else None
                                for t in instructs], non_streaming_mode=True)
    if variant == "custom_voice":
        inputs["speakers"] = [r.line.speaker for r in rows]
    return inputs


def line_key(seed: int, *parts) -> int:
    """A row's 32-bit key from the seed and what identifies the line (its text, segment, voice, language)."""
    digest = hashlib.blake2b(repr((int(seed), *parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def stream_keys(rows: Sequence[Row], seed: int | None) -> list[int]:
    """Each row's random stream key (morph/decode/streams.py): from the seed and what the row says, in whose voice
    and language, so a line's take is the same whatever it is rendered beside; drawn from torch's generator when
    there is no seed."""
    if seed is None:
        return torch.randint(0, 2**32, (len(rows),)).tolist()
    identities: dict[tuple, tuple] = {}  # one hash per voice and setting, however many lines use it
    keys = []
    for r in rows:
        known = (id(r.line.voice), r.line.language, r.line.speaker, r.line.instruct)
        if known not in identities:
            identities[known] = r.line.identity()
        keys.append(line_key(seed, r.text, r.segment, identities[known]))
    return keys


def prompt_tokens(text: str, voice: Voice | None = None, instruct: str = "", count=len) -> int:
    """The prompt's tokens (at most: `count` gives a text's tokens, by default one per character), plus an ICL
    voice's transcript and reference frames."""
    tokens = count(text) + count(instruct) + PROMPT_OVERHEAD_TOKENS
    if voice is not None and voice.icl:
        tokens += count(voice.ref_text or "") + int(voice.ref_code.shape[0])
    return tokens


def prefill_tokens(text: str, voice: Voice | None = None, instruct: str = "", count=len) -> int:
    """The tokens the talker prefills for a row, at most: for a voice, VOICE_PREFILL_TOKENS and an ICL voice's
    reference frames; for a built-in speaker or an instruct (non-streaming: the text in the prompt), prompt_tokens."""
    if voice is None:
        return prompt_tokens(text, voice, instruct, count)
    return VOICE_PREFILL_TOKENS + (int(voice.ref_code.shape[0]) if voice.icl else 0)


def token_count(tts, private: bool = False):
    """A text's tokens as the loaded model's tokenizer splits it (English runs about four characters a token, so
    one per character would size the cache and the declared memory for prompts several times too long); one per
    character where the model has no text tokenizer. Each text is tokenized once per counter: every line of an ICL
    voice repeats its transcript. `private`: count with a copy of the tokenizer, one caller at a time, on threads
    beside the one that renders (a fast tokenizer refuses a second thread while it works: "Already borrowed")."""
    tokenizer = getattr(getattr(tts.tts, "processor", None), "tokenizer", None)
    if tokenizer is None:
        return len
    if private:
        tokenizer = copy.deepcopy(tokenizer)
    count = functools.lru_cache(maxsize=None)(
        lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0)
    if not private:
        return count
    lock = threading.Lock()

    def counted(text: str) -> int:
        with lock:
            return count(text)
    return counted
