"""CUDA-graph plumbing, checked on CPU: the fallback, the shared step, and no leaks.

The real capture needs a GPU (bench/gpu_exactness.py checks graph == eager there). Here a
stand-in capture runs the step's warm-ups like the real one and replays by calling the
step again, so everything around the capture (static buffers, rewinding, keys, the LRU,
invalidation when weights move) runs for real.
"""

import pytest
import torch

from morph import graphs
from morph.sampling import Sampling
from morph.settings import GenerationSettings

from .helpers import recorded_codes

GREEDY = Sampling(do_sample=False)


class FakeGraph:
    def __init__(self, step):
        self.step = step

    def replay(self):
        return self.step()


def fake_capture(step, pool=None, warmup=2):
    state = torch.get_rng_state()
    for _ in range(warmup):
        step()
    torch.set_rng_state(state)
    return graphs.CapturedStep(FakeGraph(step), None)


class ReplayingStep(graphs.CapturedStep):
    def replay(self):
        return self.graph.replay()


def fake_capture_returning(step, pool=None):
    captured = fake_capture(step, pool)
    return ReplayingStep(captured.graph, None)


def test_graph_modes_fall_back_to_eager_on_cpu(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio)
    settings = GenerationSettings(seq_groups=5, do_sample=True, seed=3, max_new_tokens=12)
    out = {}
    try:
        for mode in ("eager", "graphs", "compile"):
            tiny_tts.patch.mode = mode
            assert tiny_tts.patch.resolved_mode(torch.device("cpu")) == "eager"
            with recorded_codes(tiny_tts.tts) as rec:
                tiny_tts.clone("Graphs need a GPU.", voice, "English", settings)
            out[mode] = rec[0][0]
    finally:
        tiny_tts.patch.mode = "auto"
    assert torch.equal(out["eager"], out["graphs"]) and torch.equal(out["eager"], out["compile"])
    assert len(tiny_tts.patch.predictor.graphs) == 0 and len(tiny_tts.patch.loop.graphs) == 0


def test_mode_is_checked():
    with pytest.raises(ValueError, match="mode must be one of"):
        graphs.check_mode("fast")
    assert graphs.resolve_mode("auto", torch.device("cpu")) == "eager"
    assert graphs.resolve_mode("auto", torch.device("cuda")) == "graphs"


def test_graph_cache_is_an_lru_and_drops_everything_when_its_owner_changes():
    cache = graphs.GraphCache(max_graphs=3, capture_fn=lambda step, pool: graphs.CapturedStep(None, step()))
    cache.bind("weights@1")
    for k in range(1, 16):
        cache.get(("predictor", k), lambda: k)
    assert len(cache) == 3 and cache.keys() == [("predictor", 13), ("predictor", 14), ("predictor", 15)]
    cache.get(("predictor", 13), lambda: None)  # a hit moves to the back
    assert cache.keys()[-1] == ("predictor", 13)
    cache.bind("weights@1")
    assert len(cache) == 3
    cache.bind("weights@2")  # moved, cast or re-fused: every graph points at old storage
    assert len(cache) == 0


def test_predictor_graph_step_is_the_lean_step_and_stays_bounded(tiny_tts):
    pred = tiny_tts.patch.predictor
    saved = pred.graphs
    pred.graphs = graphs.GraphCache(max_graphs=4, capture_fn=fake_capture_returning)
    cp = pred.cp
    try:
        for batch in (1, 3, 2):
            x = torch.randn(batch, 2, cp.model.codec_embedding[0].weight.shape[1],
                            generator=torch.Generator().manual_seed(batch))
            for k in (15, 7, 5, 4, 1):
                graphed = pred._graph_predict(x, k, GREEDY, compiled=False)
                assert torch.equal(graphed, pred.step(x, k, GREEDY))
                assert torch.equal(graphed, pred.predict(x, k, GREEDY, mode="eager"))  # tiny fp32: same picks
                assert len(pred.graphs) <= 4
                assert len(pred._states) <= 4
        assert len(pred.graphs) == 4
        cp.to(torch.float64)
        cp.to(torch.float32)  # the weights moved: the next call captures afresh
        pred._graph_predict(x, 5, GREEDY, compiled=False)
        assert len(pred.graphs) == 1
    finally:
        pred.graphs = saved


def test_talker_loop_with_graphs_gives_the_eager_codes(tiny_tts, ref_audio):
    """The frame step captured (stand-in) and replayed == the same step run op by op == upstream."""
    loop = tiny_tts.patch.loop
    saved = loop.graphs
    loop.graphs = graphs.GraphCache(max_graphs=2, capture_fn=fake_capture)
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    out = {}
    try:
        for k in (15, 5, 15):
            settings = GenerationSettings(seq_groups=k, do_sample=True, subtalker=Sampling(do_sample=True),
                                          seed=99, max_new_tokens=14)
            for mode in ("eager", "graphs"):
                tiny_tts.patch.mode = mode
                if mode == "graphs":  # run the seam-B loop on CPU with the stand-in capture
                    tiny_tts.patch.resolved_mode = lambda device: "graphs"
                with recorded_codes(tiny_tts.tts) as rec:
                    tiny_tts.clone("Graphs and eager agree.", voice, "English", settings)
                vars(tiny_tts.patch).pop("resolved_mode", None)
                out[mode] = rec[0][0]
            assert tiny_tts.patch.last_run["mode"] == "graphs"
            assert torch.equal(out["eager"], out["graphs"]), k
            assert len(loop.graphs) <= 2
    finally:
        vars(tiny_tts.patch).pop("resolved_mode", None)
        tiny_tts.patch.mode = "auto"
        loop.graphs = saved
