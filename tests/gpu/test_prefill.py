"""The lean prefill on a GPU (morph/decode/lean.py lean_prefill; the tiny model): fp32 gives upstream's talker
forward to rounding, as on the CPU (tests/morph/decode/test_prefill.py); replayed from its bucket's CUDA graph
(morph/decode/prefill_graphs.py), a slice gives what it gives op by op; a server's buckets, captured before its
first request, serve a row joining alone with no capture."""

from __future__ import annotations

import torch

from morph.decode.prefill_graphs import MAX_SHAPES, PrefillGraphs, live_shapes
from morph.settings import LIVE_MAX_PROMPT, prefill_bucket
from tests.morph.decode.prefill_case import alone, assert_same, both, slice_of, worst


def test_the_lean_prefill_is_upstreams_forward_on_the_gpu(cuda_tts):
    upstream, ours, pads = both(cuda_tts)
    assert all(w < 1e-4 for w in worst(upstream, ours, pads).values()), worst(upstream, ours, pads)


def test_each_bucket_is_captured_once_and_replays_the_slices_prefill(cuda_tts):
    """Slices of two buckets in turn, each through its graph, against lean_prefill over the slice alone (fp32, to
    the rounding of a larger product): a bucket's second slice replays its graph; a larger bucket replaces the
    arena and drops the graphs of the old one, and the smaller bucket is captured again over the new one."""
    loop, embeds, mask, tables = slice_of(cuda_tts)
    short = int(mask[0].sum())
    one, two = (embeds[:1, -short:], mask[:1, -short:]), (embeds, mask)
    assert prefill_bucket(1, short) != prefill_bucket(*mask.shape)
    graphs = PrefillGraphs()
    graphs.bind(loop.owner(cuda_tts.device, embeds.dtype))
    with torch.inference_mode():
        for part, captured in ((one, 1), (one, 1), (two, 1), (one, 2), (one, 2), (two, 2)):
            assert_same(graphs.prefill(loop, *part, tables, captured=True), alone(loop, *part, tables), tol=1e-4)
            assert len(graphs.graphs) == captured
            assert prefill_bucket(*part[1].shape) in graphs.graphs
    assert not graphs.graphs.failed


def test_a_servers_buckets_captured_before_its_first_request_serve_a_join_of_one_with_no_capture(cuda_tts,
                                                                                                 monkeypatch):
    """PrefillGraphs.warm (LiveEngine.ready): every bucket of live_shapes is captured, kept beside MAX_SHAPES others,
    and a row joining alone after it replays its bucket's graph, giving its prefill op by op."""
    import morph.graphs

    loop, embeds, mask, tables = slice_of(cuda_tts)
    graphs = PrefillGraphs()
    graphs.bind(loop.owner(cuda_tts.device, embeds.dtype))
    with torch.inference_mode():
        shapes = live_shapes(LIVE_MAX_PROMPT)
        graphs.warm(loop, shapes, embeds.dtype)
        assert len(graphs.graphs) == len(shapes) and all(s in graphs.graphs for s in shapes)
        assert graphs.graphs.max_graphs == len(shapes) + MAX_SHAPES
        captures = []
        capture = morph.graphs.capture
        monkeypatch.setattr(morph.graphs, "capture", lambda *a, **k: (captures.append(a), capture(*a, **k))[1])
        short = int(mask[0].sum())
        one = (embeds[:1, -short:], mask[:1, -short:])
        assert_same(graphs.prefill(loop, *one, tables, captured=True), alone(loop, *one, tables), tol=1e-4)
        assert captures == []
