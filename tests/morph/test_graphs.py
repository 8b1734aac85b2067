"""The graph cache's bookkeeping, checked on CPU with a stand-in capture (tests/gpu/ captures for real)."""

import torch

from morph import graphs


def test_graph_cache_is_an_lru_and_drops_everything_when_its_owner_changes(monkeypatch):
    roles = []
    monkeypatch.setattr(graphs, "capture", lambda step, pool, warmup, role:
                        roles.append((role, warmup)) or graphs.CapturedStep(None, step()))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    cache = graphs.GraphCache(max_graphs=3)
    cache.bind("weights@1")
    for k in range(1, 16):
        cache.get(("frame", k), lambda: k)
    assert len(cache) == 3 and all(("frame", k) in cache for k in (13, 14, 15))
    assert cache.get(("frame", 13), lambda: None).outputs == 13  # a hit is not captured again
    cache.get(("frame", 16), lambda: 16)  # ... and moved to the back, so 14 is the oldest now
    assert ("frame", 13) in cache and ("frame", 14) not in cache
    cache.bind("weights@1")
    assert len(cache) == 3
    cache.bind("weights@2")  # moved, cast or re-fused: every graph points at old storage
    assert len(cache) == 0
    cache.get(("frame", 1), lambda: 1)
    cache.drop()  # the graphs' inputs moved (prefill_graphs.py's arena grew), not the weights
    assert len(cache) == 0
    cache.get(("frame", 2), lambda: 2)
    cache.bind("weights@2")  # still bound to the weights they were captured against
    assert ("frame", 2) in cache
    # the codec's calls replay beside the frame step's graphs: captured on a stream of their own (graphs.capture)
    graphs.GraphCache(role=graphs.CODEC_CAPTURE, warmup=1).get("call", lambda: None)
    assert set(roles[:-1]) == {(graphs.CAPTURE, 2)} and roles[-1] == (graphs.CODEC_CAPTURE, 1)
