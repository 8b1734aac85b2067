"""Sampling follows HF generate: same warper order, same RNG use, same picks."""

import pytest
import torch

from morph.decode.sampling import pick, warp
from morph.settings import Sampling


def hf_pick(scores, s):
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    procs = LogitsProcessorList()
    if s.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(s.temperature))
    if s.top_k:
        procs.append(TopKLogitsWarper(s.top_k))
    if s.top_p < 1.0:
        procs.append(TopPLogitsWarper(s.top_p))
    probs = procs(None, scores).softmax(-1)
    return torch.multinomial(probs, 1).squeeze(1)


@pytest.mark.parametrize("s", [Sampling(True, 0.9, 50, 1.0), Sampling(True, 0.7, 0, 0.8),
                               Sampling(True, 1.0, 5, 0.5), Sampling(True, 1.3, 2048, 0.95),
                               Sampling(True, 2.0, 0, 1.0)])  # 2.0: the widget's most
def test_seeded_sampling_matches_hf_warpers(s):
    scores = torch.randn(4, 2048) * 3
    torch.manual_seed(11)
    expected = hf_pick(scores, s)
    torch.manual_seed(11)
    assert torch.equal(pick(scores, s), expected)


def test_bf16_logits_are_sampled_in_float32_as_hf_does():
    # upstream's generate casts the step's logits to float32 before the warpers
    scores = (torch.randn(256, 2048) * 3).bfloat16()  # enough rows that a bf16 draw picks otherwise in some
    s = Sampling(True, 0.9, 50, 0.95)
    torch.manual_seed(11)
    expected = hf_pick(scores.float(), s)
    torch.manual_seed(11)
    assert torch.equal(pick(scores, s), expected)


def test_greedy_is_argmax_and_draws_nothing():
    scores = torch.randn(3, 100)
    state = torch.get_rng_state()
    assert torch.equal(pick(scores, Sampling(do_sample=False)), scores.argmax(-1))
    assert torch.equal(torch.get_rng_state(), state)


def test_top_k_keeps_k_and_top_p_keeps_the_nucleus():
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isfinite(warp(scores, Sampling(True, 1.0, 2, 1.0))).sum() == 2
    kept = torch.isfinite(warp(scores, Sampling(True, 1.0, 0, 0.7)))
    assert kept.tolist() == [[True, True, False, False, False]]


def test_a_token_whose_cumulative_probability_is_exactly_one_minus_top_p_is_cut_as_hf_cuts_it():
    """Four equal tokens (probabilities exactly 0.25) and top_p 0.5: HF removes what sums to <= 1 - top_p, two."""
    from transformers.generation.logits_process import TopPLogitsWarper

    scores = torch.zeros(1, 4)
    kept = torch.isfinite(warp(scores, Sampling(True, 1.0, 0, 0.5)))
    assert torch.equal(kept, torch.isfinite(TopPLogitsWarper(0.5)(None, scores))) and int(kept.sum()) == 2


def test_batched_groups_sample_every_row():
    torch.manual_seed(0)
    picks = pick(torch.randn(2, 10, 64), Sampling(True, 0.9, 50, 1.0))
    assert picks.shape == (2, 10) and picks.dtype == torch.int64


@pytest.mark.parametrize("bad, match", [(Sampling(temperature=0), "temperature"), (Sampling(top_k=-1), "top_k"),
                                        (Sampling(top_p=0.0), "top_p"), (Sampling(top_p=1.5), "top_p")])
def test_out_of_range_sampling_is_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=f"Generate: {match}"):
        bad.validate("Generate")


def test_the_edges_of_each_range_are_accepted():
    """top_k 0 and top_p 1.0 switch their warper off, and are what the defaults use; any top_p in (0, 1] is a nucleus."""
    for ok in (Sampling(top_k=0), Sampling(top_p=1.0), Sampling(top_p=0.5), Sampling(temperature=0.01)):
        assert ok.validate("Generate") is ok


def test_top_k_cuts_before_top_p_does():
    """HF's order: top-p's nucleus is taken over what top-k left, renormalised. Over the full distribution 0.7 keeps
    two tokens; over the top-2 it keeps one."""
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    kept = torch.isfinite(warp(scores, Sampling(True, 1.0, 2, 0.7)))
    assert kept.tolist() == [[True, False, False, False, False]]


def test_talker_scores_penalise_seen_tokens_toward_zero_and_guard_eos_until_min_new_tokens():
    """Upstream's repetition penalty divides a seen token's positive logit and multiplies a negative one; EOS is
    barred while fewer than min_new_tokens frames are made, and allowed from that frame on; suppressed tokens never."""
    from morph.decode.sampling import talker_scores

    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, True, False, False, False]])
    eos = torch.tensor([False, False, False, True, False])
    suppress = torch.tensor([False, False, False, False, True])
    minimum = torch.tensor(3)
    before = talker_scores(logits, seen, torch.tensor([2]), minimum, eos, suppress, 2.0)
    at = talker_scores(logits, seen, torch.tensor([3]), minimum, eos, suppress, 2.0)
    inf = float("inf")
    assert before.tolist() == [[1.0, -4.0, 1.0, -inf, -inf]]
    assert at.tolist() == [[1.0, -4.0, 1.0, 0.5, -inf]]
    # each row its own count (rows that joined a running batch later), and a seen logit between 0 and 1 divided too
    rows = talker_scores(logits.repeat(2, 1), torch.tensor([[False, False, True, False, False]] * 2),
                         torch.tensor([2, 3]), minimum, eos, suppress, 2.0)
    assert rows.tolist() == [[2.0, -2.0, 0.5, -inf, -inf], [2.0, -2.0, 0.5, 0.5, -inf]]
    logits[0, 2] = 0.5
    assert talker_scores(logits, seen | ~seen, torch.tensor([3]), minimum, eos, suppress, 2.0)[0, 2] == 0.25


def test_warpers_and_picks_read_the_vocabulary_axis_of_grouped_scores():
    """The code predictor samples scores [B, n, V]: the warpers match them slice by slice, a greedy pick is the argmax
    over V, and top-k 1 leaves one token to draw."""
    scores = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(3)) * 3
    s = Sampling(True, 0.8, 10, 0.7)
    assert torch.equal(warp(scores, s), torch.stack([warp(row, s) for row in scores]))
    assert torch.equal(pick(scores, Sampling(do_sample=False)), scores.argmax(-1))
    assert torch.equal(pick(scores, Sampling(True, 1.0, 1, 1.0)), scores.argmax(-1))
