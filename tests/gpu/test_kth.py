"""The k-th-value kernel is bit-equal to torch.topk's values[..., k-1]."""

import pytest
import torch

from morph.kernels import kth


@pytest.mark.parametrize("cols", [2048, 3072, 100])
@pytest.mark.parametrize("k", [1, 7, 50, 100])
def test_random_rows(cols, k):
    g = torch.Generator(device="cuda").manual_seed(cols * 1000 + k)
    scores = torch.randn(3, 15, cols, device="cuda", generator=g) * 4
    assert torch.equal(kth.kth_largest(scores, k), torch.topk(scores, k)[0][..., -1:])


def test_rows_with_ties_negatives_and_masked_values():
    scores = torch.randn(64, 2048, device="cuda")
    scores[:8, :300] = 1.5  # the k-th value inside a block of ties
    scores[8:16] = -scores[8:16].abs()  # all negative
    scores[16:24, 1000:] = -float("inf")  # masked (suppressed) tokens
    scores[24:32] = scores[24:32].round()  # many ties everywhere
    scores[32, :] = 0.0
    scores[33, :] = -0.0
    for k in (1, 2, 50, 299, 300, 301, 1000, 2048):
        assert torch.equal(kth.kth_largest(scores, k), torch.topk(scores, k)[0][..., -1:]), k


def test_it_works_inside_a_graph():
    scores = torch.randn(4, 2048, device="cuda")
    static_out = []
    graph = torch.cuda.CUDAGraph()
    kth.kth_largest(scores * 2, 50)  # compile the kernel outside the capture
    with torch.cuda.graph(graph):
        static_out.append(kth.kth_largest(scores * 2, 50))  # an input allocated inside the capture
    scores.copy_(torch.randn(4, 2048, device="cuda"))
    graph.replay()
    assert torch.equal(static_out[0], torch.topk(scores * 2, 50)[0][..., -1:])
