"""One line under any decode stack: upstream qwen-tts (optionally with HF's eager attention) or a morph
mode at a seq_groups k, and a Runner that builds the line's inputs once and speaks it."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from bench.workload import REF_TEXT, TEXT, eos_held, eos_held_back
from morph.decode.runner import check_mode
from morph.api import MorphTTS
from morph.render import BatchTTS, Line, OnStep
from morph.settings import GenerationSettings, Sampling


class Runner:
    """Builds one prompt's inputs once and runs upstream's model.generate on it, or a morph stack's decode of the
    line (decode only), or speaks the whole line through the public API (end to end): `frames` frames, EOS held
    back (bench/workload.py)."""

    def __init__(self, tts: MorphTTS, voice):
        self.tts = tts
        self.voice = voice
        m = tts.tts
        self.ids = m._tokenize_texts([m._build_assistant_text(TEXT)])
        self.ref_ids = [m._tokenize_texts([m._build_ref_text(REF_TEXT)])[0] if voice.icl else None]
        self.prompt = m._prompt_items_to_voice_clone_prompt([tts._prompt_item(voice)])

    def generate(self, frames: int, upstream: bool = False, greedy: bool = False, seed: int = 0,
                 on_step: OnStep | None = None):
        """The line's codes [frames, 16], no codec: upstream's generate on the prepared inputs (under
        stack("upstream")), or a morph stack's as a render decodes it (BatchTTS.codes: the engine in every mode but
        eager, whose static batch is upstream's generate with the morph loop; the patched model's generate alone would
        run the loop's HF layers in every mode), at the stack's seq_groups; `on_step` as BatchTTS.codes takes it."""
        sampling = Sampling(do_sample=not greedy)
        settings = eos_held(GenerationSettings(seq_groups=15 if upstream else self.tts.patch.seq_groups,
                                               do_sample=not greedy, subtalker=sampling, max_new_tokens=frames,
                                               seed=seed), frames)
        if not upstream:
            return BatchTTS(self.tts).codes([Line(TEXT, self.voice, "English")], settings, on_step=on_step,
                                            who="bench")[0]
        kwargs = settings.upstream_kwargs(TEXT)
        torch.manual_seed(seed)
        with eos_held_back(self.tts.tts.model.talker):
            codes, _ = self.tts.tts.model.generate(input_ids=self.ids, ref_ids=self.ref_ids,
                                                   voice_clone_prompt=self.prompt, languages=["english"], **kwargs)
        return codes[0]

    def speak(self, frames: int, seq_groups: int, upstream: bool) -> np.ndarray:
        """Text in, audio out: MorphTTS.clone, or upstream's generate_voice_clone (under stack("upstream"))."""
        settings = eos_held(GenerationSettings(seq_groups=seq_groups, seed=0, max_new_tokens=frames), frames)
        if not upstream:
            return self.tts.clone(TEXT, self.voice, "English", settings)
        torch.manual_seed(settings.seed)
        with eos_held_back(self.tts.tts.model.talker):
            wavs, _ = self.tts.tts.generate_voice_clone(text=TEXT, language="English",
                                                        voice_clone_prompt=[self.tts._prompt_item(self.voice)],
                                                        **settings.upstream_kwargs(TEXT))
        return wavs[0]


@contextlib.contextmanager
def attention_impl(tts: MorphTTS, impl: str):
    """Switch every sub-model's HF attention implementation for the block."""
    configs = {id(m.config): m.config for m in tts.tts.model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation")}
    saved = {key: c._attn_implementation for key, c in configs.items()}
    for c in configs.values():
        c._attn_implementation = impl
    try:
        yield
    finally:
        for key, c in configs.items():
            c._attn_implementation = saved[key]


@contextlib.contextmanager
def stack(tts: MorphTTS, spec: str):
    """Run the block under a stack: 'upstream', 'upstream-eager-attention' (the same with
    HF's eager attention instead of sdpa: a control for numeric sensitivity) or 'MODE:K'."""
    if spec.startswith("upstream"):
        with tts.upstream(), (attention_impl(tts, "eager") if spec == "upstream-eager-attention"
                              else contextlib.nullcontext()):
            yield
        return
    mode, k = spec.split(":")
    tts.patch.mode, tts.patch.seq_groups = check_mode(mode, "bench.speed --stacks"), int(k)
    yield
