"""The runner policy on CPU: what each mode runs as, and what a failed capture does.

A real capture needs a GPU (tests/gpu/). Here `graphs.capture` is replaced by a stand-in
that runs the step's warm-ups like the real one and replays by calling the step again,
so everything around the capture (static buffers, rewinding, keys, fallbacks, OOM) runs
for real through the public API.
"""

import logging

import numpy as np
import pytest
import torch

from morph.render import BatchTTS, Line

from morph import graphs
from morph.decode import runner
from morph.settings import GenerationSettings, Sampling



class StandInGraph:
    def __init__(self, step):
        self.step = step

    def replay(self):
        return self.step()


def stand_in_capture(step, pool=None, warmup=2, role="capture"):
    """As graphs.capture: `warmup` runs, then the captured run's outputs (which a real capture's replay writes)."""
    state = torch.get_rng_state()
    for _ in range(warmup):
        step()
    outputs = step()
    torch.set_rng_state(state)
    return graphs.CapturedStep(StandInGraph(step), outputs)


@pytest.fixture
def fast_on_cpu(monkeypatch, tiny_tts):
    """Let the fast modes run on CPU through the stand-in capture."""
    real_resolve = runner.resolve
    monkeypatch.setattr(runner, "resolve", lambda mode, device, check: mode if mode in ("graphs", "lean")
                        else real_resolve(mode, device, check))
    monkeypatch.setattr(graphs, "capture", stand_in_capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    yield tiny_tts
    tiny_tts.patch.mode = "auto"
    tiny_tts.release_device_state()


def codes(tts, voice, mode, settings, text="Graphs and op by op agree."):
    """The engine's codes for one line in `mode`."""
    tts.patch.mode = mode
    return BatchTTS(tts).codes([Line(text, voice, "English")], settings)[0]


def sampled(k):
    return GenerationSettings(seq_groups=k, do_sample=True, subtalker=Sampling(do_sample=True), seed=99,
                              max_new_tokens=14)


def test_modes_on_cpu_run_eager():
    for mode in ("auto", "eager", "graphs", "fused"):
        assert runner.resolve(mode, torch.device("cpu"), lambda: None) == "eager"
    assert runner.resolve("lean", torch.device("cpu"), lambda: None) == "lean"


def test_auto_on_cuda_runs_fused_where_triton_is(monkeypatch):
    """Whether or not this machine has Triton (the README's CPU-only route has none): the next test covers its
    absence."""
    monkeypatch.setattr(runner.graphs, "triton_available", lambda: True)
    assert runner.resolve("auto", torch.device("cuda"), lambda: None) == "fused"


def test_without_triton_the_triton_modes_run_plain_graphs(monkeypatch, caplog):
    monkeypatch.setattr(runner.graphs, "triton_available", lambda: False)
    monkeypatch.setattr(runner, "_logged", set())
    for mode in ("auto", "fused"):
        assert runner.resolve(mode, torch.device("cuda"), lambda: None) == "graphs"
    assert "needs Triton" in caplog.text
    with pytest.raises(ValueError, match="mode must be one of"):
        runner.resolve("fast", torch.device("cpu"), lambda: None)


def test_the_retired_compile_mode_runs_fused_and_says_so(tiny_dir, caplog):
    from morph.api import MorphTTS

    with caplog.at_level(logging.WARNING, logger="morph.decode.runner"):
        assert runner.check_mode("compile") == "fused"
        tts = MorphTTS.load(str(tiny_dir), device="cpu", dtype="fp32", attention="sdpa", mode="compile")
    assert tts.patch.mode == "fused"
    assert [r.getMessage() for r in caplog.records] == [
        "morph: speed mode 'compile' was retired (slower than fused, and minutes to build on its first call); "
        "running fused instead"] * 2
    with pytest.raises(ValueError, match="mode must be one of auto, eager, lean, graphs, fused;"):
        runner.check_mode("fast")


def test_a_checkpoint_the_lean_layers_cannot_run_goes_eager():
    from morph.decode.lean import LeanUnsupported

    def unsupported():
        raise LeanUnsupported("hidden_act 'gelu'")

    assert runner.resolve("graphs", torch.device("cuda"), unsupported) == "eager"


def test_the_captured_step_gives_the_op_by_op_codes(fast_on_cpu, ref_audio):
    tts = fast_on_cpu
    voice = tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    for k in (15, 5, 15):
        assert torch.equal(codes(tts, voice, "graphs", sampled(k)), codes(tts, voice, "lean", sampled(k))), k
        assert len(tts.patch.loop.graphs) <= 4
    tts.patch.mode = "graphs"
    BatchTTS(tts).codes([Line("Once more.", voice, "English")], sampled(5))
    assert tts.patch.last_run["mode"] == "graphs"


def test_a_failed_capture_runs_op_by_op_for_its_run_and_the_next_run_captures(fast_on_cpu, ref_audio, monkeypatch,
                                                                             caplog):
    """One policy for every capture (GraphCache.get_or_none): the frame step's, the joining rows' prefill's and the
    live codec's calls'. Each fails once in a run, says so, and the run goes on op by op to the same audio; the next
    run captures all three."""
    tts = fast_on_cpu
    voice = tts.make_voice(*ref_audio)
    lines = [Line("Graphs and op by op agree.", voice, "English"), Line("A second line.", voice, "English")]
    tts.patch.mode = "lean"
    want = BatchTTS(tts).render(lines, sampled(5))
    tried = []

    def broken(step, pool=None, warmup=2, role="capture"):
        tried.append(role)
        raise RuntimeError("injected capture failure")

    monkeypatch.setattr(graphs, "capture", broken)
    tts.patch.mode = "graphs"
    with caplog.at_level(logging.WARNING, logger="morph.graphs"):
        got = BatchTTS(tts).render(lines, sampled(5))
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert sorted(tried) == ["capture", "capture", "codec capture"]  # once a cache, not once a width or a shape
    said = sorted(r.getMessage() for r in caplog.records if r.name == "morph.graphs")
    assert said == [
        "morph: could not capture the live codec's calls (RuntimeError: injected capture failure); they run op by op "
        "for the rest of this batch, slower to the first audio under load. If this repeats, report it",
        "morph: could not capture the prefill of joining rows (RuntimeError: injected capture failure); it runs op by "
        "op for the rest of this batch, slower to the first audio. If this repeats, report it",
        "morph: could not prepare the graphs decoder (RuntimeError: injected capture failure); this run decodes op "
        "by op, several times slower; the next run tries again. If this repeats, set speed_mode to graphs or eager "
        "and report it"]
    monkeypatch.setattr(graphs, "capture", stand_in_capture)
    got = BatchTTS(tts).render(lines, sampled(5))
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    loop = tts.patch.loop
    assert len(loop.graphs) and len(loop.prefills.graphs) and len(tts.codec.captured(tts.device).graphs)


def test_a_capture_out_of_memory_is_an_out_of_memory(fast_on_cpu, ref_audio, monkeypatch):
    tts = fast_on_cpu
    voice = tts.make_voice(*ref_audio)

    def oom(step, pool=None, warmup=2, role="capture"):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(graphs, "capture", oom)
    tts.patch.mode = "graphs"
    # not swallowed as "graphs unavailable": the front end's out-of-memory handling sees it
    with pytest.raises(RuntimeError, match=r"ran out of memory rendering a single row .*CUDA out of memory \(injected\)"):
        BatchTTS(tts).codes([Line("Out of memory.", voice, "English")], sampled(5))
    assert len(tts.patch.loop.graphs) == 0


def test_a_slow_preparation_is_announced_before_it_starts(monkeypatch, caplog):
    """The user waits through a first fused capture: the status line says so first."""
    monkeypatch.setattr(runner, "_prepared", set())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    seen_before_capture = []

    def capture(step, pool=None, warmup=2, role="capture"):
        seen_before_capture.append([r.getMessage() for r in caplog.records if getattr(r, "status", False)])
        return stand_in_capture(step, pool, warmup, role)

    monkeypatch.setattr(graphs, "capture", capture)
    cache = graphs.GraphCache()
    with caplog.at_level(logging.INFO, logger="morph.decode.runner"):
        for key, mode in ((1, "fused"), (2, "fused"), (3, "graphs")):
            runner.fast_step(cache, key, lambda: None, lambda: None, mode)
    first_fused, second_fused, graphs_ = seen_before_capture
    assert len(first_fused) == 1 and first_fused[0].startswith("morph: preparing the fused decoder, about 10 s")
    assert second_fused == graphs_ == first_fused + ["morph: the fused decoder is ready (prepared in 0.0 s)"]
    plain = [r.getMessage() for r in caplog.records if not getattr(r, "status", False)]
    assert plain == ["morph: the fused decoder is ready (prepared in 0.0 s)",
                     "morph: the graphs decoder is ready (prepared in 0.0 s)"]


def test_a_width_after_a_failed_capture_announces_nothing_and_runs_op_by_op(monkeypatch, caplog):
    """The batch's next width, after its first capture failed, neither tries again nor says it prepares anything."""
    monkeypatch.setattr(runner, "_prepared", set())
    tries = []

    def failing(step, pool=None, warmup=2, role="capture"):
        tries.append(role)
        raise RuntimeError("capture refused (injected)")

    monkeypatch.setattr(graphs, "capture", failing)
    cache, fallback = graphs.GraphCache(), lambda: "op by op"
    with caplog.at_level(logging.INFO, logger="morph"):
        first = runner.fast_step(cache, 1, lambda: None, fallback, "fused")
        said = [r.getMessage() for r in caplog.records]
        caplog.clear()
        second = runner.fast_step(cache, 2, lambda: None, fallback, "fused")
    assert first is fallback and second is fallback and len(tries) == 1
    assert said[0].startswith("morph: preparing the fused decoder") and "could not prepare" in said[1]
    assert caplog.records == []
