"""Each row's random stream (morph/decode/streams.py): its Exp(1) values."""

import torch

from morph.decode import sampling
from morph.decode.streams import RowStreams


def test_no_exp1_value_is_zero_so_a_token_of_probability_zero_is_never_drawn():
    """Key 477's frame 0 holds, at slot 8 and token 1349, the stream's top 24-bit uniform, which float32 rounded to
    1.0: an Exp(1) value of 0, and that token's race 0 / 0 = NaN, which the draw picked though its probability was 0
    (and the fused race turned into an index past the vocabulary)."""
    streams = RowStreams(3072, "cpu")
    noise = streams.frame(torch.tensor([477, 508]), torch.tensor([0, 0]))
    assert bool((noise.values > 0).all()) and bool(torch.isfinite(noise.values).all())
    probs = torch.zeros(2, 3072)
    probs[:, :50] = 1 / 50  # top-k left 50 tokens
    picks = sampling.draw(probs, noise(probs, 8))
    assert bool((picks < 50).all()), picks


def test_the_values_are_those_of_the_hash_elsewhere():
    """Only the one rounded value moves: the stream's other values, and so every seeded take, are as they were
    (these are the values before the fix)."""
    values = RowStreams(64, "cpu").frame(torch.tensor([1, 2, 3]), torch.tensor([0, 5, 9])).values
    assert values.sum(dtype=torch.float64).item() == 3088.112951261399
    assert values[0, 0, :4].tolist() == [2.873579263687134, 0.69233238697052, 0.8022572994232178, 0.5011309385299683]
    assert values[2, 15, 60:].tolist() == [0.22502382099628448, 1.178081750869751, 0.36319229006767273,
                                           0.04896284639835358]
