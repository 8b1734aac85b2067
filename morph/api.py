"""The Python API: a loaded Qwen3-TTS model with the morph predictor attached (docs/python-api.md shows its use)."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .codec.layers import LeanCodec
from .config import ModelConfig
from .decode.prefill_graphs import largest_first, voice_shapes
from .engine.runner import WARM_FRAMES, ready_lines, warm_lines, warm_prefills
from .reference.patch import MorphPatch
from .lines.reference_audio import MAX_TRANSCRIPT_CHARS_PER_SECOND, prepare_reference
from .lines.words import FOR_PYTHON, Words
from .lines.voice import Voice
from .memory import replays_graphs
from .prompts import voice_prefill_lengths
from .qwen.checkpoints import DEFAULT_MODEL, VARIANT_NAMES, locate_checkpoint
from .qwen.loading import load_qwen_tts, place
from .render import BatchTTS, Line, OnStep
from .settings import DEFAULT_BATCH_SIZE, SAMPLE_RATE, GenerationSettings

log = logging.getLogger(__name__)

VARIANT_EXAMPLES = {"base": "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "custom_voice": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
                    "voice_design": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"}


class MorphTTS:
    def __init__(self, tts, config: ModelConfig):
        self.tts, self.config = tts, config
        self.held = 0  # device bytes the engine keeps between renders: counted as free when a batch is sized
        self.ready_width: int | None = None  # the widest batch ready() made the engine ready for, until released
        self.patch = MorphPatch(tts, mode=config.mode)
        self.codec = LeanCodec(tts.model.speech_tokenizer.model)  # the audio of every mode but eager

    @classmethod
    def load(cls, source: str = DEFAULT_MODEL, device: str = "auto", dtype: str = "auto",
             attention: str = "auto", search_dirs: list[Path] = (), download_dir: Path | None = None,
             mode: str = "auto", progress_bars: bool = False, place_on: str | None = None) -> "MorphTTS":
        """`mode`: auto (fused on CUDA, eager elsewhere), fused, graphs, lean or eager (docs/architecture.md, Decode
        modes). `place_on`: where the weights load when not `device`, where they run (a memory manager moves them)."""
        folder = locate_checkpoint(source, list(search_dirs), download_dir)
        config = ModelConfig.resolve(source, folder, device, dtype, attention, mode)
        on = config.device if place_on is None else torch.device(place_on)
        return cls(load_qwen_tts(folder, on, config.dtype, config.attention, progress_bars), config)

    @property
    def source(self) -> str:
        return self.config.source

    @property
    def variant(self) -> str:
        return self.config.variant

    @property
    def model_size(self) -> str:
        return self.config.model_size

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
        """Drop what the engine keeps on the device besides the weights (for offloading); rebuilt on the next call."""
        self.codec.release()
        self.patch.loop.release()  # last: it gives the memory of dropped CUDA graphs back
        self.held, self.ready_width = 0, None

    def ready(self, width: int = DEFAULT_BATCH_SIZE, who: str = "Load model") -> float | None:
        """A short render of `width` rows compiles, builds and captures what later renders up to that width reuse, then
        x-vector voices' prefills (an ICL voice's when made). Seconds taken; None in eager or off CUDA."""
        if not replays_graphs(self):
            return None
        log.info("%s: getting the engine ready for batches of up to %d rows (the first time on this machine "
                 "Triton compiles the kernels, about a minute)", who, width, extra={"status": True})
        self.release_device_state()
        start = time.perf_counter()
        _WarmUp(self).render(ready_lines(self, width), batch_size=width, who=who)
        self.ready_width = width
        if self.variant == "base":  # an x-vector voice's rows prefill its markup alone, whatever their text
            self._prefills_ready(warm_lines(self, 1)[0].voice)
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        log.info("%s: the engine is ready (%.1f s; %.2f GiB kept for its batches)", who, seconds, self.held / 2**30,
                 extra={"status": True})
        return seconds

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
                f"{who} needs a {VARIANT_NAMES[variant]} model, but {self.source} is a "
                f"{VARIANT_NAMES.get(self.variant, self.variant)} model; load one such as {VARIANT_EXAMPLES[variant]}")

    def make_voice(self, waveform, sample_rate: int, transcript: str | None = None, x_vector_only: bool = False,
                   who: str = "make_voice", words: Words = FOR_PYTHON) -> Voice:
        """A voice from reference audio ([T], [C, T], [T, C] or [1, C, T]; PCM or float, any rate), x-vector only
        without a transcript. A clip over 30 s is trimmed, or refused with a transcript (which would name words cut)."""
        self.require_variant("base", who)
        icl = bool((transcript or "").strip()) and not x_vector_only
        clip = prepare_reference(waveform, sample_rate, f"{who}: reference audio", icl=icl, words=words)
        return self.voice_from_clip(clip, transcript, x_vector_only, who)

    def voice_from_clip(self, clip: np.ndarray, transcript: str | None = None, x_vector_only: bool = False,
                        who: str = "make_voice") -> Voice:
        """make_voice for a clip prepare_reference made (mono float32, 24 kHz): the CLI checks it before loading."""
        self.require_variant("base", who)
        transcript = (transcript or "").strip() or None
        if transcript is None and not x_vector_only:
            log.info("%s: no transcript given, so the voice uses x-vector-only mode", who)
            x_vector_only = True
        seconds = clip.size / SAMPLE_RATE
        if transcript and len(transcript) > MAX_TRANSCRIPT_CHARS_PER_SECOND * seconds:
            log.warning("%s: the transcript has %d characters for a %.1f s clip, more than anyone says in that time; "
                        "check that it is the transcript of this clip and not the text to speak",
                        who, len(transcript), seconds)
        item = self.tts.create_voice_clone_prompt(ref_audio=(clip, SAMPLE_RATE), ref_text=transcript,
                                                  x_vector_only_mode=x_vector_only)[0]
        voice = Voice(spk_embedding=item.ref_spk_embedding.detach().float().cpu(),
                      ref_code=None if item.ref_code is None else item.ref_code.detach().long().cpu(),
                      ref_text=transcript, model_size=self.model_size)
        if voice.icl and replays_graphs(self):  # made ready now, not in its first render: its reference decoded
            with torch.cuda.stream(self.codec.side_stream(self.device)), torch.inference_mode():  # as rows open
                self.codec.primed(voice.ref_code, self.device)
            if self.ready_width is not None:  # and the prefills of its rows joining
                self._prefills_ready(voice)
        return voice

    def _prefills_ready(self, voice: Voice) -> None:
        """Capture the prefill buckets `voice`'s rows meet joining a batch of up to ready()'s width, into `held`."""
        shapes = {s for n in voice_prefill_lengths(self, voice) for s in voice_shapes(n, self.ready_width)}
        before = torch.cuda.memory_allocated(self.device)
        warm_prefills(self, largest_first(shapes))
        self.held += max(0, torch.cuda.memory_allocated(self.device) - before)

    def clone(self, text: str, voice: Voice, language: str = "Auto", settings: GenerationSettings = None,
              on_step: OnStep | None = None, who: str = "Generate", split_long_text: bool = True,
              words: Words = FOR_PYTHON) -> np.ndarray:
        return self._speak(_cloned(text, voice, language, who), settings, on_step, who, split_long_text, words)

    def custom_voice(self, text: str, speaker: str, instruct: str = "", language: str = "Auto",
                     settings: GenerationSettings = None, on_step: OnStep | None = None,
                     who: str = "Generate (CustomVoice)", split_long_text: bool = True) -> np.ndarray:
        line = Line(text, language=language, speaker=str(speaker), instruct=instruct or "")
        return self._speak(line, settings, on_step, who, split_long_text)

    def voice_design(self, text: str, instruct: str, language: str = "Auto", settings: GenerationSettings = None,
                     on_step: OnStep | None = None, who: str = "Generate (VoiceDesign)",
                     split_long_text: bool = True) -> np.ndarray:
        return self._speak(Line(text, language=language, instruct=instruct or ""), settings, on_step, who,
                           split_long_text)

    def _speak(self, line: Line, settings: GenerationSettings | None, on_step: OnStep | None, who: str,
               split_long_text: bool, words: Words = FOR_PYTHON) -> np.ndarray:
        return BatchTTS(self).render([line], settings, batch_size=None, on_step=on_step, who=who,
                                     split_long_text=split_long_text, words=words)[0]

    def stream(self, text: str, voice: Voice, language: str = "Auto", settings: GenerationSettings = None,
               who: str = "Stream") -> Iterator[np.ndarray]:
        """clone's take as float32 24 kHz chunks as they are made, on the reader's thread: each next() runs frames until
        a chunk is ready, raising the render's errors; closing the iterator stops the render and frees its state."""
        ready: list[np.ndarray] = []  # the line's chunks the last frame handed out, in order
        _, frames = BatchTTS(self).frames([_cloned(text, voice, language, who)], settings, batch_size=None, who=who,
                                          on_chunk=lambda i, wav: ready.append(wav))
        return _chunks(frames, ready)

    def _prompt_item(self, voice: Voice):
        from qwen_tts import VoiceClonePromptItem

        return VoiceClonePromptItem(ref_code=None if voice.ref_code is None else voice.ref_code.to(self.device),
                                    ref_spk_embedding=voice.spk_embedding.to(self.device),
                                    x_vector_only_mode=not voice.icl, icl_mode=voice.icl, ref_text=voice.ref_text)


def _cloned(text: str, voice: Voice, language: str, who: str) -> Line:
    if voice is None:  # a Line without a voice is a VoiceDesign line
        raise ValueError(f"{who}: no voice given; make one with make_voice or load_voice")
    return Line(text, voice, language)


def _chunks(frames: Iterator[None], ready: list[np.ndarray]) -> Iterator[np.ndarray]:
    """The chunks in `ready` as each of a render's frames hands them out."""
    failure = None
    try:
        for _ in frames:
            yield from ready
            ready.clear()
    except Exception as e:  # raised to the reader after the chunks made before it
        failure = e
    finally:  # closed by the reader (GeneratorExit at a yield): the render stops before its next frame
        frames.close()
    yield from ready  # the last rows' audio, decoded once the frames are done
    if failure is not None:
        raise failure


class _WarmUp(BatchTTS):
    """MorphTTS.ready's render: every row stopped after WARM_FRAMES frames."""

    def stop(self, row) -> int:
        return min(row.limit, WARM_FRAMES)
