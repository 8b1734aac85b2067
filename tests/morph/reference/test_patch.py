"""The patch's seams on one model instance: the codec's SnakeBeta forwards, and talker.generate, which runs the
reference loop with each call's own inputs."""

import pytest
import torch

import morph.reference.loop
from morph import graphs
from morph.reference.patch import MorphPatch


def load(tiny_dir):
    from morph.qwen.compat import import_qwen_tts

    return import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)


def test_the_snake_seam_is_per_instance_and_removable(tiny_dir):
    a, b = load(tiny_dir), load(tiny_dir)
    p = MorphPatch(a, seq_groups=5)
    assert "generate" not in vars(a.model.talker.code_predictor)
    snakes = [m for m in a.model.speech_tokenizer.model.modules() if type(m).__name__ == "SnakeBeta"]
    assert snakes and p.snakes == snakes
    if graphs.triton_available():  # the fused activation, on this instance only
        assert all("forward" in vars(m) for m in snakes)
        assert not any("forward" in vars(m) for m in b.model.speech_tokenizer.model.modules())
    p.remove()
    assert not any("forward" in vars(m) for m in snakes)


@pytest.mark.parametrize("bad", ["fast", "cuda", ""])
def test_mode_is_checked(tiny_dir, bad):
    with pytest.raises(ValueError, match="mode must be one of auto, eager, lean, graphs, fused;"):
        MorphPatch(load(tiny_dir), mode=bad)


def test_patch_is_per_instance_and_removable(tiny_dir):
    a, b = load(tiny_dir), load(tiny_dir)
    cls_generate = type(a.model.talker).generate
    p = MorphPatch(a, seq_groups=5)
    assert "generate" in vars(a.model.talker) and "generate" not in vars(b.model.talker)
    assert "generate" not in vars(a.model.talker.code_predictor)  # upstream's predictor is never called
    assert type(a.model.talker).generate is cls_generate
    with pytest.raises(RuntimeError, match="already patched"):
        MorphPatch(a)
    p.remove()
    assert "generate" not in vars(a.model.talker)
    assert not any("forward" in vars(m) for m in p.snakes)


def test_a_bad_mode_leaves_the_talker_unpatched(tiny_dir):
    tts = load(tiny_dir)
    with pytest.raises(ValueError, match="mode must be one of"):
        MorphPatch(tts, mode="fast")
    assert "generate" not in vars(tts.model.talker)


def test_an_unknown_talker_argument_is_refused_not_ignored(tiny_tts):
    with pytest.raises(RuntimeError, match="talker.generate was called with output_scores.*qwen-tts 0.1.1"):
        tiny_tts.tts.model.talker.generate(inputs_embeds=None, output_scores=True)


def test_another_packs_patch_of_the_talker_generate_is_logged(tiny_dir, monkeypatch, caplog):
    import logging

    tts = load(tiny_dir)
    cls = type(tts.model.talker)
    original = cls.generate

    def other_packs_generate(self, *args, **kwargs):  # defined here, outside qwen-tts, transformers and torch
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "generate", other_packs_generate)
    with caplog.at_level(logging.WARNING):
        MorphPatch(tts).remove()
    assert any("the talker's generate was already replaced by another package" in r.getMessage()
               for r in caplog.records)


def test_a_calls_own_inputs_go_with_it_on_its_thread_only(tiny_tts, monkeypatch):
    """MorphPatch.call: inside the block, on its thread, the talker's generate decodes with the call's inputs; another
    thread's call and any call after the block get the patch's defaults; an inner block's inputs end with it."""
    import threading

    seen = []
    monkeypatch.setattr(morph.reference.loop, "generate", lambda loop, **kw: seen.append(
        (loop, kw["seq_groups"], kw["on_step"], kw["row_stops"])))
    talker, default, mine = tiny_tts.tts.model.talker, tiny_tts.patch.seq_groups, tiny_tts.patch.loop
    step = lambda: None  # noqa: E731
    with tiny_tts.patch.call(3, step, [4, 2]):
        talker.generate(inputs_embeds=None)
        other = threading.Thread(target=lambda: talker.generate(inputs_embeds=None))
        other.start()
        other.join()
        with tiny_tts.patch.call(15):
            talker.generate(inputs_embeds=None)
        talker.generate(inputs_embeds=None)
    talker.generate(inputs_embeds=None)
    assert seen == [(mine, 3, step, [4, 2]), (mine, default, None, None), (mine, 15, None, None),
                    (mine, 3, step, [4, 2]), (mine, default, None, None)]
    assert default != 3 and tiny_tts.patch.seq_groups == default
    with pytest.raises(ValueError, match="seq_groups"):
        with tiny_tts.patch.call(16):
            pass
