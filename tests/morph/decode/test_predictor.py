"""The predictor's step: the crossbar, HF and lean layers, seq_groups bounds, no-copy stacking."""

import pytest
import torch

from morph.decode.predictor import Layers, Predictor
from morph.settings import Sampling, check_seq_groups

from ..helpers import storage_bytes

GREEDY = Sampling(do_sample=False)


@pytest.fixture
def predictor(tiny_tts):
    return tiny_tts.patch.loop.predictor


def embeds(pred, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, pred.cp.model.codec_embedding[0].weight.shape[1], generator=g)


def hf(pred, x):
    return pred.hf_layers(x.shape[0], x.device, x.dtype)


@pytest.mark.parametrize("k", range(1, 16))
def test_crossbar_groups_are_argmax_of_their_head_on_the_seed_state(predictor, k):
    x = embeds(predictor)
    layers, seen = hf(predictor, x), []

    def spy(h, g):
        out = layers(h, g)
        seen.append(out[:, -1].clone())
        return out

    codes = predictor.codes(x, k, GREEDY, Layers(spy, layers.heads))
    assert codes.shape == (3, 15) and codes.dtype == torch.int64
    assert len(seen) == k  # k sequential passes, no extra pass for the crossbar
    seed_state = seen[-1]  # the hidden state that produced group k-1
    for g in range(k, 15):
        assert torch.equal(codes[:, g], predictor.cp.lm_head[g](seed_state).argmax(-1))
    # The sequential prefix is the same as in the exact (k=15) decode.
    assert torch.equal(codes[:, :k], predictor.codes(x, 15, GREEDY, hf(predictor, x))[:, :k])


@pytest.mark.parametrize("k", [15, 5, 1])
def test_lean_layers_give_the_hf_layers_codes(predictor, k):
    """fp32 on CPU the lean layers round differently (about 1e-6), never enough to flip a greedy pick here."""
    for batch in (1, 4):
        x = embeds(predictor, batch, seed=batch)
        lean = predictor.lean_layers(predictor.lean_state(batch, x.device, x.dtype), "lean")
        assert torch.equal(predictor.codes(x, k, GREEDY, lean), predictor.codes(x, k, GREEDY, hf(predictor, x)))
        h_lean, h_hf = lean(x, 0), hf(predictor, x)(x, 0)
        assert (h_lean - h_hf).abs().max() < 1e-4


@pytest.mark.parametrize("bad", [0, 16, -1, 5.0, "5", True, None])
def test_seq_groups_out_of_range_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="Generate: seq_groups must be an integer from 1 to 15"):
        check_seq_groups(bad, who="Generate")
    assert check_seq_groups(15) == 15 and check_seq_groups(1) == 1


def test_stacked_heads_are_views_not_copies(tiny_dir):
    from morph.qwen.compat import import_qwen_tts

    tts = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    cp = tts.model.talker.code_predictor
    before = storage_bytes(tts.model)
    pred = Predictor(cp)
    stacked = pred.stacked_heads()
    heads = [h.weight for h in cp.lm_head]
    assert stacked.shape == (15, *heads[0].shape)
    assert {w.untyped_storage().data_ptr() for w in heads} == {stacked.untyped_storage().data_ptr()}
    assert storage_bytes(tts.model) == before  # the originals were freed, nothing duplicated
    x = embeds(pred)
    pred.codes(x, 5, GREEDY, hf(pred, x))
    assert pred.stacked_heads() is stacked  # reused across calls

    pred.release()
    assert len({h.weight.untyped_storage().data_ptr() for h in cp.lm_head}) == 15
    assert storage_bytes(tts.model) == before


def test_heads_are_restacked_after_a_cast(tiny_dir):
    """A memory manager may move or cast the model; the stack must follow, not go stale."""
    from morph.qwen.compat import import_qwen_tts

    tts = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    cp = tts.model.talker.code_predictor
    pred = Predictor(cp)
    pred.stacked_heads()
    cp.to(torch.float64)
    stacked = pred.stacked_heads()
    assert stacked.dtype == torch.float64
    assert all(h.weight.data_ptr() == stacked[i].data_ptr() for i, h in enumerate(cp.lm_head))
