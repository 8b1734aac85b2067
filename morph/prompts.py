"""Lines to what upstream's generate takes and hands the talker: checks, rows, prompts, each row's random stream key."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import logging
import threading
import types
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .lines.line import Line, Row
from .lines.text_split import MAX_SEGMENT_CHARS, split_text
from .lines.voice import Voice, check_voice_fits
from .lines.words import FOR_PYTHON, Words
from .settings import GenerationSettings

log = logging.getLogger(__name__)

PROMPT_OVERHEAD_TOKENS = 32  # chat markup, codec control tokens, the speaker embedding
# A voice's row reads its text a token a frame (streaming mode): it prefills its markup, speaker and ICL reference.
VOICE_PREFILL_TOKENS = 16


def make_rows(tts, lines: Sequence[Line], settings: GenerationSettings, who: str, split_long_text: bool,
              labels: Sequence[str] | None = None, words: Words = FOR_PYTHON) -> list[Row]:
    """Every line checked (before any work), and split into rows where it is over MAX_SEGMENT_CHARS."""
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


@dataclasses.dataclass
class RowPrompt:
    """One row's part of batch_inputs: its prompt [1, L, H] and trailing text [1, T, H] embeddings, tts_pad's [1, 1,
    H]; `done`: the event of the side stream that built it off the engine's thread (None: built on its stream)."""

    embeds: torch.Tensor
    trailing: torch.Tensor
    pad: torch.Tensor
    done: torch.cuda.Event | None = None


def prompt_inputs(tts, rows: list[Row], tokenize: Callable[[list[str]], list[torch.Tensor]] | None = None) -> dict:
    """What upstream's generate_voice_clone, _custom_voice or _voice_design pass model.generate besides the languages
    and sampling settings, built their way; tokenize: a PrivateTokenizer's, on a thread beside the engine's."""
    model, variant = tts.tts, rows[0].line.variant
    tokenize = tokenize or model._tokenize_texts
    inputs = dict(input_ids=tokenize([model._build_assistant_text(r.text) for r in rows]))
    if variant == "base":
        items = [tts._prompt_item(r.line.voice) for r in rows]
        return dict(inputs, voice_clone_prompt=model._prompt_items_to_voice_clone_prompt(items),
                    ref_ids=[tokenize([model._build_ref_text(it.ref_text)])[0] if it.ref_text else None
                             for it in items],
                    non_streaming_mode=False)
    # upstream drops the instruct for 0.6B CustomVoice models, which were trained without one
    drop = variant == "custom_voice" and tts.model_size == "0b6"
    instructs = ["" if drop else r.line.instruct.strip() for r in rows]
    inputs.update(instruct_ids=[tokenize([model._build_instruct_text(t)])[0] if t else None for t in instructs],
                  non_streaming_mode=True)
    if variant == "custom_voice":
        inputs["speakers"] = [r.line.speaker for r in rows]
    return inputs


def row_prompts(model, languages: list[str], input_ids: list[torch.Tensor], voice_clone_prompt: dict | None = None,
                ref_ids: list | None = None, instruct_ids: list | None = None, speakers: list[str] | None = None,
                non_streaming_mode: bool = False) -> list[RowPrompt]:
    """Each row's talker prompt, built alone with upstream's calls on upstream's shapes, so bit for bit upstream's."""
    cfg, talker = model.config.talker_config, model.talker
    device, dtype = talker.device, input_ids[0].dtype

    def text(ids: torch.Tensor) -> torch.Tensor:
        return talker.text_projection(talker.get_text_embeddings()(ids))

    def codec(ids: list[int]) -> torch.Tensor:
        return talker.get_input_embeddings()(torch.tensor([ids], device=device, dtype=dtype))

    with torch.no_grad():
        bos, eos, pad = text(torch.tensor([[model.config.tts_bos_token_id, model.config.tts_eos_token_id,
                                            model.config.tts_pad_token_id]], device=device, dtype=dtype)).chunk(3, 1)
        voices = None if voice_clone_prompt is None else model.generate_speaker_prompt(voice_clone_prompt)
        prompts = []
        for i, (ids, language) in enumerate(zip(input_ids, languages, strict=True)):
            speaker = speakers[i] if speakers else None
            icl = voices is not None and voice_clone_prompt["icl_mode"][i]
            if voices is not None:
                spk = voices[i] if icl or voice_clone_prompt["x_vector_only_mode"][i] else None
            else:
                spk = codec([cfg.spk_id[speaker.lower()]]) if speaker else None
            lang = language.lower()
            language_id = None if lang == "auto" else cfg.codec_language_id[lang]
            if lang in ("chinese", "auto") and speaker and cfg.spk_is_dialect[speaker.lower()] is not False:
                language_id = cfg.codec_language_id[cfg.spk_is_dialect[speaker.lower()]]
            tags = [cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id] if language_id is None \
                else [cfg.codec_think_id, cfg.codec_think_bos_id, language_id, cfg.codec_think_eos_id]
            codes = torch.cat([codec(tags)] + ([] if spk is None else [spk.view(1, 1, -1)])
                              + [codec([cfg.codec_pad_id, cfg.codec_bos_id])], dim=1)
            # <|im_start|>assistant\n, then the codec tags under tts_pad and tts_bos
            row = torch.cat((text(ids[:, :3]), torch.cat((pad.expand(-1, codes.shape[1] - 2, -1), bos), dim=1)
                             + codes[:, :-1]), dim=1)
            if icl:
                more, rest = model.generate_icl_prompt(
                    text_id=ids[:, 3:-5], ref_id=ref_ids[i][:, 3:-2], ref_code=voice_clone_prompt["ref_code"][i].to(
                        device), tts_pad_embed=pad, tts_eos_embed=eos, non_streaming_mode=non_streaming_mode)
            elif non_streaming_mode:  # the whole text in the prompt, then codec bos
                body = ids[:, 3:-5]
                said = torch.cat((text(body), eos), dim=1) + codec([cfg.codec_pad_id] * (body.shape[1] + 1))
                more, rest = torch.cat((said, pad + codec([cfg.codec_bos_id])), dim=1), pad
            else:  # the text's first token beside codec bos, the rest read a token a frame
                more, rest = text(ids[:, 3:4]) + codes[:, -1:], torch.cat((text(ids[:, 4:-5]), eos), dim=1)
            instruct = instruct_ids[i] if instruct_ids is not None else None
            prompts.append(RowPrompt(torch.cat(([] if instruct is None else [text(instruct)]) + [row, more], dim=1),
                                     rest, pad))
    return prompts


def left_pads(prompts: list[RowPrompt]) -> list[int]:
    width = max(p.embeds.shape[1] for p in prompts)
    return [width - p.embeds.shape[1] for p in prompts]


def batch_inputs(model, prompts: list[RowPrompt], *, min_new_tokens: int, **options) -> dict:
    """What upstream's generate passes talker.generate: the rows' prompts left-padded into a batch, and options."""
    cfg, pad = model.config.talker_config, prompts[0].pad
    pads, longest = left_pads(prompts), max(p.trailing.shape[1] for p in prompts)
    # made on the device: a copy from the host would wait for the engine's queue
    mask = torch.ones(len(prompts), prompts[0].embeds.shape[1] + pads[0], dtype=torch.long, device=pad.device)
    for i, n in enumerate(pads):
        mask[i, :n] = 0
    return dict(
        inputs_embeds=torch.cat([F.pad(p.embeds, (0, 0, n, 0)) for p, n in zip(prompts, pads, strict=True)]),
        attention_mask=mask,
        trailing_text_hidden=torch.cat([torch.cat((p.trailing, pad.expand(-1, longest - p.trailing.shape[1], -1)),
                                                  dim=1) for p in prompts]),
        tts_pad_embed=pad, **options, min_new_tokens=min_new_tokens, eos_token_id=cfg.codec_eos_token_id,
        suppress_tokens=[i for i in range(cfg.vocab_size - 1024, cfg.vocab_size) if i != cfg.codec_eos_token_id])


def stream_keys(rows: Sequence[Row], seed: int | None) -> list[int]:
    """Each row's random stream key: a 32-bit hash of the seed, its text, segment, voice, language; no seed: torch's."""
    if seed is None:
        return torch.randint(0, 2**32, (len(rows),)).tolist()
    identities: dict[tuple, tuple] = {}  # one hash per voice and setting, however many lines use it
    keys = []
    for r in rows:
        known = (id(r.line.voice), r.line.language, r.line.speaker, r.line.instruct)
        if known not in identities:
            identities[known] = r.line.identity()
        digest = hashlib.blake2b(repr((int(seed), r.text, r.segment, identities[known])).encode(), digest_size=4)
        keys.append(int.from_bytes(digest.digest(), "little"))
    return keys


def prompt_tokens(text: str, voice: Voice | None = None, instruct: str = "", count=len) -> int:
    """The prompt's tokens at most (`count` gives a text's, by default one per character), an ICL voice's included."""
    tokens = count(text) + count(instruct) + PROMPT_OVERHEAD_TOKENS
    if voice is not None and voice.icl:
        tokens += count(voice.ref_text or "") + int(voice.ref_code.shape[0])
    return tokens


def voice_prefill_lengths(tts, voice: Voice) -> set[int]:
    """Tokens a row in `voice` prefills whatever its text, language Auto or named (prefill_tokens bounds them above)."""
    lines = [Line("Hi.", voice, language) for language in ("Auto", "English")]
    rows = make_rows(tts, lines, GenerationSettings(), "voice", False)
    with torch.inference_mode():
        prompts = row_prompts(tts.tts.model, [line.language for line in lines], **prompt_inputs(tts, rows))
    return {int(p.embeds.shape[1]) for p in prompts}


def prefill_tokens(text: str, voice: Voice | None = None, instruct: str = "", count=len) -> int:
    """The most tokens the talker prefills for a row: a voice's markup and reference frames, else prompt_tokens."""
    if voice is None:
        return prompt_tokens(text, voice, instruct, count)
    return VOICE_PREFILL_TOKENS + (int(voice.ref_code.shape[0]) if voice.icl else 0)


class PrivateTokenizer:
    """A copy of the model's processor for threads beside the engine's, one caller at a time (a fast tokenizer refuses
    a second thread: "Already borrowed"): upstream's _tokenize_texts, and token counts, the last COUNTS_KEPT kept."""

    COUNTS_KEPT = 4096

    def __init__(self, tts):
        self._model = tts.tts
        processor = copy.deepcopy(getattr(self._model, "processor", None))
        self._own = types.SimpleNamespace(processor=processor, device=self._model.device)
        self._lock = threading.Lock()
        tokenizer = getattr(self._own.processor, "tokenizer", None)
        self._count = len if tokenizer is None else functools.lru_cache(maxsize=self.COUNTS_KEPT)(_counter(tokenizer))

    def tokenize(self, texts: list[str]) -> list[torch.Tensor]:
        with self._lock:
            return type(self._model)._tokenize_texts(self._own, texts)

    def count(self, text: str) -> int:
        with self._lock:
            return self._count(text)


def _counter(tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0


def token_count(tts) -> Callable[[str], int]:
    """A text's tokens as the model's tokenizer splits it (one a character would oversize the cache), cached for the
    counter's life; one a character without a tokenizer. Threads beside the render's count with a PrivateTokenizer."""
    tokenizer = getattr(getattr(tts.tts, "processor", None), "tokenizer", None)
    return len if tokenizer is None else functools.lru_cache(maxsize=None)(_counter(tokenizer))
