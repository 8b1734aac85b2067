"""seq_groups=15 in mode "eager" reproduces upstream qwen-tts exactly (fp32, CPU): codes and audio, for
one line (a batch of one) and for a batch of several, for all three model variants."""

import numpy as np
import pytest
import torch

from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling

from .helpers import recorded_codes

TEXT = "Hello world, this is a test of the morph decoder."
TEXTS = ["The first line of the batch, and the longest of the three.", "A short one.", "Number three."]
LANGUAGES = ["English", "Auto", "German"]


def exact(do_sample: bool, seed: int = 1234, frames: int = 20) -> GenerationSettings:
    return GenerationSettings(seq_groups=15, do_sample=do_sample, subtalker=Sampling(do_sample=do_sample),
                              seed=seed, max_new_tokens=frames)


def upstream_run(tts, settings, generate_name: str, **inputs):
    """Codes and audio from upstream's generate_* on the plain model, seeded right before the call."""
    with tts.upstream() as plain, recorded_codes(plain) as codes:
        torch.manual_seed(settings.seed)
        wavs, _ = getattr(plain, generate_name)(**inputs, **settings.upstream_kwargs(TEXT))
    return codes[0], wavs


def morph_run(tts, run):
    """Codes and audio of `run()` on the morph-patched model."""
    with recorded_codes(tts.tts) as codes:
        audio = run()
    return codes[0], audio


def assert_same(upstream, morph):
    (up_codes, up_audio), (codes, audio) = upstream, morph
    assert len(up_codes) == len(codes) and up_codes[0].shape[1] == 16 and up_codes[0].shape[0] > 3
    assert all(torch.equal(a, b) for a, b in zip(up_codes, codes, strict=True))
    assert all(a.dtype == np.float32 and np.array_equal(a, b) for a, b in zip(up_audio, audio, strict=True))


@pytest.fixture(scope="module")
def voices(tiny_tts):
    rng = np.random.RandomState(0)
    t = np.arange(2 * 24000) / 24000
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.randn(t.size))
    wave = wave.astype(np.float32)
    return {False: tiny_tts.make_voice(wave, 24000),
            True: tiny_tts.make_voice(wave, 24000, transcript="A short reference sentence.")}


@pytest.mark.parametrize("icl", [False, True], ids=["xvector", "icl"])
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_k15_one_line_equals_upstream(tiny_tts, voices, icl, do_sample):
    voice, settings = voices[icl], exact(do_sample)
    assert voice.icl == icl
    upstream = upstream_run(tiny_tts, settings, "generate_voice_clone", text=TEXT, language="English",
                            voice_clone_prompt=[tiny_tts._prompt_item(voice)])
    assert_same(upstream, morph_run(tiny_tts, lambda: [tiny_tts.clone(TEXT, voice, "English", settings)]))


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_k15_batch_equals_upstreams_batch(tiny_tts, voices, do_sample):
    """Mixed x-vector and ICL voices and languages in one batch: upstream's batched generate_voice_clone."""
    settings, picked = exact(do_sample, frames=12), [voices[True], voices[False], voices[True]]
    upstream = upstream_run(tiny_tts, settings, "generate_voice_clone", text=TEXTS, language=LANGUAGES,
                            voice_clone_prompt=[tiny_tts._prompt_item(v) for v in picked])
    lines = [Line(t, v, lang) for t, v, lang in zip(TEXTS, picked, LANGUAGES, strict=True)]
    assert_same(upstream, morph_run(tiny_tts, lambda: BatchTTS(tiny_tts).render(lines, settings, sort=False)))


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_k15_custom_voice_and_voice_design_equal_upstream(model_dirs, do_sample):
    from morph.api import MorphTTS

    settings = exact(do_sample, frames=12)
    cv = MorphTTS.load(str(model_dirs("tiny", "custom_voice")), device="cpu", dtype="fp32", attention="sdpa")
    upstream = upstream_run(cv, settings, "generate_custom_voice", text=TEXT, speaker="Vivian", language="English")
    assert_same(upstream, morph_run(cv, lambda: [cv.custom_voice(TEXT, "Vivian", "", "English", settings)]))
    speakers = [cv.speakers[0], cv.speakers[-1], cv.speakers[0]]
    upstream = upstream_run(cv, settings, "generate_custom_voice", text=TEXTS, speaker=speakers, language=LANGUAGES)
    lines = [Line(t, language=lang, speaker=s) for t, lang, s in zip(TEXTS, LANGUAGES, speakers, strict=True)]
    assert_same(upstream, morph_run(cv, lambda: BatchTTS(cv).render(lines, settings, sort=False)))

    vd = MorphTTS.load(str(model_dirs("tiny", "voice_design")), device="cpu", dtype="fp32", attention="sdpa")
    for instruct in ("A warm, low voice.", ""):
        upstream = upstream_run(vd, settings, "generate_voice_design", text=TEXT, instruct=instruct,
                                language="English")
        assert_same(upstream, morph_run(vd, lambda: [vd.voice_design(TEXT, instruct, "English", settings)]))


def test_k15_equals_upstream_with_projection(model_dirs, ref_audio):
    """The 1.7B layout: the predictor is narrower than the talker, behind a Linear projection."""
    from morph.api import MorphTTS

    tts = MorphTTS.load(str(model_dirs("tiny-proj", "base")), device="cpu", dtype="fp32", attention="sdpa")
    assert isinstance(tts.tts.model.talker.code_predictor.small_to_mtp_projection, torch.nn.Linear)
    voice = tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    for do_sample in (False, True):
        settings = exact(do_sample, seed=7, frames=16)
        upstream = upstream_run(tts, settings, "generate_voice_clone", text=TEXT, language="English",
                                voice_clone_prompt=[tts._prompt_item(voice)])
        assert_same(upstream, morph_run(tts, lambda: [tts.clone(TEXT, voice, "English", settings)]))


def test_k15_equals_upstream_eager_attention(tiny_dir, ref_audio):
    """Eager attention needs the explicit causal prefill mask; sdpa infers it."""
    from morph.api import MorphTTS

    tts = MorphTTS.load(str(tiny_dir), device="cpu", dtype="fp32", attention="eager")
    voice = tts.make_voice(*ref_audio)
    settings = exact(False, seed=0, frames=16)
    upstream = upstream_run(tts, settings, "generate_voice_clone", text=TEXT, language="English",
                            voice_clone_prompt=[tts._prompt_item(voice)])
    assert_same(upstream, morph_run(tts, lambda: [tts.clone(TEXT, voice, "English", settings)]))
