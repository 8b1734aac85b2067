"""The Python API: a loaded Qwen3-TTS model with the morph predictor attached.

    tts = MorphTTS.load("Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    voice = tts.make_voice(waveform, sample_rate, transcript="...")
    audio = tts.clone("Hello there.", voice, settings=GenerationSettings(seq_groups=5, seed=1))

Host services (progress, cancel) come in through `on_step(step, total)`, called once per
frame before it is decoded; an exception raised there stops generation and propagates.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .loading import DEFAULT_MODEL, load_qwen_tts, locate_checkpoint, place, resolve_attention, resolve_device, \
    resolve_dtype
from .patch import MorphPatch
from .reference_audio import prepare_reference
from .settings import SAMPLE_RATE, GenerationSettings
from .text_split import MAX_SEGMENT_CHARS, split_text
from .voice import Voice, check_voice_fits

log = logging.getLogger(__name__)

OnStep = Callable[[int, int], None]
MAX_TRANSCRIPT_CHARS_PER_SECOND = 25  # fast speech is ~15-20 characters a second
SEGMENT_PAUSE_SECONDS = 0.2  # between the segments of a long text
VARIANT_NAMES = {"base": "Base (voice clone)", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}
VARIANT_EXAMPLES = {"base": "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "custom_voice": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
                    "voice_design": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"}


class MorphTTS:
    def __init__(self, tts, source: str, mode: str = "auto"):
        self.tts = tts
        self.source = source
        self.patch = MorphPatch(tts, mode=mode)

    @classmethod
    def load(cls, source: str = DEFAULT_MODEL, device: str = "auto", dtype: str = "auto",
             attention: str = "auto", search_dirs: list[Path] = (), download_dir: Path | None = None,
             mode: str = "auto") -> "MorphTTS":
        """`mode` picks the decode path (morph/graphs.py): auto (CUDA graphs on CUDA, eager elsewhere),
        compile (fastest; about a minute of compiling on a process's first run), graphs, lean or eager."""
        folder = locate_checkpoint(source, list(search_dirs), download_dir)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        return cls(load_qwen_tts(folder, dev, dt, resolve_attention(attention, dev, dt)), source, mode)

    # -- what the loaded model is ------------------------------------------------------
    @property
    def variant(self) -> str:
        return self.tts.model.tts_model_type

    @property
    def model_size(self) -> str:
        return self.tts.model.tts_model_size

    @property
    def hidden_size(self) -> int:
        return int(self.tts.model.config.talker_config.hidden_size)

    @property
    def languages(self) -> list[str]:
        return ["Auto"] + sorted(lang.capitalize() for lang in self.tts.model.get_supported_languages() if lang != "auto")

    @property
    def speakers(self) -> list[str]:
        return sorted(self.tts.model.get_supported_speakers() or [])

    @property
    def device(self) -> torch.device:
        return self.tts.device

    def to(self, device) -> "MorphTTS":
        place(self.tts, device)
        return self

    def release_device_state(self) -> None:
        """Drop what the engine keeps on the device besides the weights (KV buffers, CUDA graphs,
        fused weight storage); it is rebuilt on the next call. For memory managers that offload."""
        self.patch.loop.release()
        self.patch.predictor.release()

    @contextlib.contextmanager
    def upstream(self):
        """Run plain qwen-tts inside this block (the reference the benchmark and tests compare to)."""
        seq_groups, mode = self.patch.seq_groups, self.patch.mode
        self.patch.remove()
        try:
            yield self.tts
        finally:
            self.patch = MorphPatch(self.tts, seq_groups, mode)

    def require_variant(self, variant: str, who: str) -> None:
        if self.variant != variant:
            raise ValueError(
                f"{who}: this node needs a {VARIANT_NAMES[variant]} model, but {self.source} is a "
                f"{VARIANT_NAMES.get(self.variant, self.variant)} model; load one such as {VARIANT_EXAMPLES[variant]}")

    # -- voices ----------------------------------------------------------------------
    def make_voice(self, waveform, sample_rate: int, transcript: str | None = None, x_vector_only: bool = False,
                   who: str = "Voice prompt") -> Voice:
        """Build a voice from reference audio ([T], [C, T], [T, C] or [1, C, T]); without a transcript it is
        x-vector only. With a transcript, a clip over 30 s is refused (trimming it would leave words in the
        transcript that the model never hears); without one, it is trimmed with a warning."""
        self.require_variant("base", who)
        transcript = (transcript or "").strip() or None
        if transcript is None and not x_vector_only:
            log.info("%s: no transcript given, so the voice uses x-vector-only mode", who)
            x_vector_only = True
        audio = prepare_reference(waveform, sample_rate, f"{who}: reference audio", icl=not x_vector_only)
        if transcript and len(transcript) > MAX_TRANSCRIPT_CHARS_PER_SECOND * audio.size / SAMPLE_RATE:
            log.warning("%s: the transcript has %d characters for a %.1f s clip, more than anyone says in that time; "
                        "check that it is the transcript of this clip and not the text to speak",
                        who, len(transcript), audio.size / SAMPLE_RATE)
        item = self.tts.create_voice_clone_prompt(ref_audio=(audio, SAMPLE_RATE), ref_text=transcript,
                                                  x_vector_only_mode=x_vector_only)[0]
        return Voice(
            spk_embedding=item.ref_spk_embedding.detach().float().cpu(),
            ref_code=None if item.ref_code is None else item.ref_code.detach().long().cpu(),
            ref_text=transcript, model_size=self.model_size,
        )

    # -- generation ------------------------------------------------------------------
    def clone(self, text: str, voice: Voice, language: str = "Auto", settings: GenerationSettings = None,
              on_step: OnStep | None = None, who: str = "Generate", split_long_text: bool = True) -> np.ndarray:
        self.require_variant("base", who)
        check_voice_fits(voice, self.hidden_size, self.model_size, who)
        return self._run(self.tts.generate_voice_clone, text, language, settings, on_step, who, split_long_text,
                         voice_clone_prompt=[self._prompt_item(voice)])

    def custom_voice(self, text: str, speaker: str, instruct: str = "", language: str = "Auto",
                     settings: GenerationSettings = None, on_step: OnStep | None = None,
                     who: str = "Generate (CustomVoice)", split_long_text: bool = True) -> np.ndarray:
        self.require_variant("custom_voice", who)
        if speaker.lower() not in {s.lower() for s in self.speakers}:
            raise ValueError(f"{who}: unknown speaker {speaker!r}; this model has {', '.join(self.speakers)}")
        return self._run(self.tts.generate_custom_voice, text, language, settings, on_step, who, split_long_text,
                         speaker=speaker, instruct=instruct.strip() or None)

    def voice_design(self, text: str, instruct: str, language: str = "Auto", settings: GenerationSettings = None,
                     on_step: OnStep | None = None, who: str = "Generate (VoiceDesign)",
                     split_long_text: bool = True) -> np.ndarray:
        self.require_variant("voice_design", who)
        return self._run(self.tts.generate_voice_design, text, language, settings, on_step, who, split_long_text,
                         instruct=instruct.strip())

    def _prompt_item(self, voice: Voice):
        from qwen_tts import VoiceClonePromptItem

        device = self.device
        return VoiceClonePromptItem(
            ref_code=None if voice.ref_code is None else voice.ref_code.to(device),
            ref_spk_embedding=voice.spk_embedding.to(device),
            x_vector_only_mode=not voice.icl, icl_mode=voice.icl, ref_text=voice.ref_text,
        )

    def _check_language(self, language: str, who: str) -> str:
        if language.lower() not in {lang.lower() for lang in self.languages}:
            raise ValueError(f"{who}: language {language!r} is not supported by this model; "
                             f"choose one of {', '.join(self.languages)}")
        return language

    def _run(self, generate, text: str, language: str, settings: GenerationSettings | None,
             on_step: OnStep | None, who: str, split_long_text: bool = True, **prompt) -> np.ndarray:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{who}: text is empty; type the words to speak")
        text = text.strip()
        segments = split_text(text) if len(text) > MAX_SEGMENT_CHARS else [text]
        if len(segments) > 1 and not split_long_text:
            raise ValueError(f"{who}: the text is {len(text)} characters, over the {MAX_SEGMENT_CHARS}-character "
                             "limit of one segment; turn on split_long_text or shorten the text")
        settings = (settings or GenerationSettings()).validate(who)
        language = self._check_language(language, who)
        items = prompt.get("voice_clone_prompt") or [None]
        warn_if_text_is_the_transcript(text, getattr(items[0], "ref_text", None), who)
        limits = [settings.upstream_kwargs(seg)["max_new_tokens"] for seg in segments]
        step = iter(range(1, sum(limits) + 1))
        self.patch.seq_groups = settings.seq_groups
        self.patch.on_step = None if on_step is None else (lambda: on_step(next(step, sum(limits)), sum(limits)))
        pieces = []
        try:
            for i, segment in enumerate(segments):
                # Every segment restarts from the same seed: one voice and delivery throughout.
                if settings.seed is not None:
                    torch.manual_seed(settings.seed)
                wavs, sr = generate(text=segment, language=language, **prompt, **settings.upstream_kwargs(segment))
                assert sr == SAMPLE_RATE, f"the 12 Hz codec decodes at {SAMPLE_RATE} Hz, got {sr}"
                pieces.append(np.asarray(wavs[0], dtype=np.float32))
        except torch.cuda.OutOfMemoryError as e:
            raise RuntimeError(f"{who}: the GPU ran out of memory ({e}); shorten the text, lower max_new_tokens, "
                               "or load the model in bf16 or on a larger GPU") from e
        finally:
            self.patch.on_step = None
        if len(segments) > 1:
            log.info("%s: rendered %d segments of a %d-character text", who, len(segments), len(text))
        return join_with_pauses(pieces)


def join_with_pauses(pieces: list[np.ndarray]) -> np.ndarray:
    """The segments of one long text, in order, with a short pause between each two."""
    pause = np.zeros(int(SEGMENT_PAUSE_SECONDS * SAMPLE_RATE), np.float32)
    joined = [pieces[0]]
    for piece in pieces[1:]:
        joined += [pause, piece]
    return np.concatenate(joined)


def warn_if_text_is_the_transcript(text: str, ref_text: str | None, who: str) -> None:
    """The text to speak and the reference transcript are easy to swap; a swap fails silently."""
    if ref_text and " ".join(ref_text.split()).lower() == " ".join(text.split()).lower():
        log.warning("%s: the text to speak is the same as the voice's transcript; if they were swapped, put "
                    "the words of the reference clip in the Voice prompt's transcript", who)
