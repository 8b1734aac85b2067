"""seq_groups=15 must reproduce upstream qwen-tts exactly (fp32, CPU)."""

import pytest
import torch

from morph.settings import GenerationSettings
from morph.sampling import Sampling

from .helpers import recorded_codes

TEXT = "Hello world, this is a test of the morph decoder."


def upstream_and_morph(tts, voice, settings):
    """Codes from upstream's generate_voice_clone, then from the morph-patched model."""
    item = tts._prompt_item(voice)
    kwargs = settings.upstream_kwargs(TEXT)
    with tts.upstream() as plain, recorded_codes(plain) as upstream:
        torch.manual_seed(settings.seed)
        plain.generate_voice_clone(text=TEXT, language="English", voice_clone_prompt=[item], **kwargs)
    with recorded_codes(tts.tts) as morph:
        tts.clone(TEXT, voice, "English", settings)
    return upstream[0][0], morph[0][0]


@pytest.mark.parametrize("icl", [False, True], ids=["xvector", "icl"])
@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_k15_equals_upstream(tiny_tts, ref_audio, icl, do_sample):
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence." if icl else None)
    assert voice.icl == icl
    settings = GenerationSettings(seq_groups=15, do_sample=do_sample, subtalker=Sampling(do_sample=do_sample),
                                  seed=1234, max_new_tokens=20)
    upstream, morph = upstream_and_morph(tiny_tts, voice, settings)
    assert upstream.shape[1] == 16 and upstream.shape[0] > 3
    assert torch.equal(upstream, morph)


def test_k15_equals_upstream_with_projection(model_dirs, ref_audio):
    """The 1.7B layout: the predictor is narrower than the talker, behind a Linear projection."""
    from morph.engine import MorphTTS

    tts = MorphTTS.load(str(model_dirs("tiny-proj", "base")), device="cpu", dtype="fp32", attention="sdpa")
    assert isinstance(tts.tts.model.talker.code_predictor.small_to_mtp_projection, torch.nn.Linear)
    voice = tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    for do_sample in (False, True):
        settings = GenerationSettings(seq_groups=15, do_sample=do_sample, subtalker=Sampling(do_sample=do_sample),
                                      seed=7, max_new_tokens=16)
        upstream, morph = upstream_and_morph(tts, voice, settings)
        assert torch.equal(upstream, morph)


def test_k15_equals_upstream_eager_attention(tiny_dir, ref_audio):
    """Eager attention needs the explicit causal prefill mask; sdpa infers it."""
    from morph.engine import MorphTTS

    tts = MorphTTS.load(str(tiny_dir), device="cpu", dtype="fp32", attention="eager")
    voice = tts.make_voice(*ref_audio)
    settings = GenerationSettings(seq_groups=15, do_sample=False, subtalker=Sampling(do_sample=False),
                                  seed=0, max_new_tokens=16)
    upstream, morph = upstream_and_morph(tts, voice, settings)
    assert torch.equal(upstream, morph)
