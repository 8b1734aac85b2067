"""The fused sampler's race kernel on the GPU (morph/kernels/sampling.py), where Triton's argmax differs from the
interpreter's: rows of non-finite scores."""

import torch

from morph.decode import sampling
from morph.kernels.sampling import sample_warped
from morph.settings import Sampling


def test_a_row_of_non_finite_scores_picks_inside_the_vocabulary_as_torch_does():
    """NaN probabilities (logits that overflowed, or NaN ones) rank first, as in torch.argmax: the race once picked
    the first padding lane past the vocabulary (3072 of 3072 here), and the frame step's scatter into `seen` then
    raised a device-side assert that ended the server's process."""
    s = Sampling(do_sample=True, temperature=0.9, top_k=50)
    scores = torch.randn(5, 3072, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    scores[0] = float("nan")
    scores[1, 7] = float("inf")  # softmax of a row with an inf is NaN everywhere
    scores[2] = -float("inf")
    scores[3, 11] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        x = scores.to(dtype)
        torch.manual_seed(5)
        want = sampling.pick(x.float(), s)
        torch.manual_seed(5)
        got = sample_warped(x, s, sampling.torch_noise)
        assert bool(((got >= 0) & (got < 3072)).all()), got
        assert torch.equal(got, want), (dtype, got, want)
