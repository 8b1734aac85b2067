"""The crossbar, the seq_groups bounds, and the no-copy stacking of the lm_heads."""

import pytest
import torch

from morph.predictor import MorphPredictor, check_seq_groups
from morph.sampling import Sampling

from .helpers import storage_bytes

GREEDY = Sampling(do_sample=False)


@pytest.fixture
def predictor(tiny_tts):
    cp = tiny_tts.tts.model.talker.code_predictor
    return tiny_tts.patch.predictor, cp


def embeds(cp, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = cp.model.codec_embedding[0].weight.shape[1]
    return torch.randn(batch, 2, hidden, generator=g)


@pytest.mark.parametrize("k", range(1, 16))
def test_crossbar_groups_are_argmax_of_their_head_on_the_seed_state(predictor, k):
    pred, cp = predictor
    seen = []
    original = pred._pass

    def spy(*args):
        out = original(*args)
        seen.append(out[:, -1].clone())
        return out

    pred._pass = spy
    try:
        x = embeds(cp)
        codes = pred.predict(x, k, GREEDY)
    finally:
        del pred._pass
    assert codes.shape == (3, 15) and codes.dtype == torch.int64
    assert len(seen) == k  # k sequential passes, no extra pass for the crossbar
    seed_state = seen[-1]  # the hidden state that produced group k-1
    for g in range(k, 15):
        assert torch.equal(codes[:, g], cp.lm_head[g](seed_state).argmax(-1))
    # The sequential prefix is the same as in the exact (k=15) decode.
    assert torch.equal(codes[:, :k], pred.predict(x, 15, GREEDY)[:, :k])


@pytest.mark.parametrize("bad", [0, 16, -1, 5.0, "5", True, None])
def test_seq_groups_out_of_range_is_a_clear_error(predictor, bad):
    pred, cp = predictor
    with pytest.raises(ValueError, match=r"seq_groups must be an integer from 1 to 15"):
        pred.predict(embeds(cp), bad, GREEDY)
    with pytest.raises(ValueError, match="Generate: seq_groups"):
        check_seq_groups(bad, who="Generate")


def test_stacked_heads_are_views_not_copies(tiny_dir):
    from morph.compat import import_qwen_tts

    tts = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    cp = tts.model.talker.code_predictor
    before = storage_bytes(tts.model)
    pred = MorphPredictor(cp)
    stacked = pred.stacked_heads()
    heads = [h.weight for h in cp.lm_head]
    assert stacked.shape == (15, *heads[0].shape)
    assert {w.untyped_storage().data_ptr() for w in heads} == {stacked.untyped_storage().data_ptr()}
    assert storage_bytes(tts.model) == before  # the originals were freed, nothing duplicated
    pred.predict(embeds(cp), 5, GREEDY)
    assert pred.stacked_heads() is stacked  # reused across calls

    pred.release()
    assert len({h.weight.untyped_storage().data_ptr() for h in cp.lm_head}) == 15
    assert storage_bytes(tts.model) == before


def test_heads_are_restacked_after_a_cast(tiny_dir):
    """A memory manager may move or cast the model; the stack must follow, not go stale."""
    from morph.compat import import_qwen_tts

    tts = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    cp = tts.model.talker.code_predictor
    pred = MorphPredictor(cp)
    pred.stacked_heads()
    cp.to(torch.float64)
    stacked = pred.stacked_heads()
    assert stacked.dtype == torch.float64
    assert all(h.weight.data_ptr() == stacked[i].data_ptr() for i, h in enumerate(cp.lm_head))


def test_patch_is_per_instance_and_removable(tiny_dir):
    from morph.compat import import_qwen_tts
    from morph.patch import patch

    qwen_tts = import_qwen_tts()
    a = qwen_tts.Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    b = qwen_tts.Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    cls_generate = type(a.model.talker.code_predictor).generate
    p = patch(a, seq_groups=5)
    assert "generate" in vars(a.model.talker.code_predictor)
    assert "generate" not in vars(b.model.talker.code_predictor)
    assert type(a.model.talker.code_predictor).generate is cls_generate
    with pytest.raises(RuntimeError, match="already patched"):
        patch(a)
    p.remove()
    assert "generate" not in vars(a.model.talker.code_predictor)


def test_seq_groups_changes_between_calls(tiny_tts, predictor):
    pred, cp = predictor
    x = embeds(cp, batch=1)
    full = pred.predict(x, 15, GREEDY)
    fast = pred.predict(x, 2, GREEDY)
    assert torch.equal(full[:, :2], fast[:, :2])
    assert torch.equal(pred.predict(x, 15, GREEDY), full)
