"""The decode's seam: the codec's SnakeBeta forwards on one model instance, and nothing else (the talker's is
morph/reference/patch.py's, tests/morph/reference/test_patch.py)."""

import pytest
import torch

from morph import graphs
from morph.decode.patch import DecodePatch


def load(tiny_dir):
    from morph.qwen.compat import import_qwen_tts

    return import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)


def test_the_snake_seam_is_per_instance_and_removable(tiny_dir):
    a, b = load(tiny_dir), load(tiny_dir)
    p = DecodePatch(a, seq_groups=5)
    assert "generate" not in vars(a.model.talker) and "generate" not in vars(a.model.talker.code_predictor)
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
        DecodePatch(load(tiny_dir), mode=bad)
