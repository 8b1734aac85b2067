"""A failed capture never takes the process down or leaves the next run degraded; a capture OOM
is an OOM; repeated runs do not grow device memory."""

import gc
import logging

import torch

from morph import graphs
from morph.decode import lean
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings

SETTINGS = GenerationSettings(seq_groups=5, seed=3, max_new_tokens=16)


def test_an_injected_capture_failure_leaves_the_next_run_working(cuda_tts, voices, monkeypatch, caplog):
    cuda_tts.release_device_state()  # no cached graph: the next run must capture
    real = lean.talker_pass

    def failing_inside_the_capture(*args, **kwargs):
        out = real(*args, **kwargs)  # allocated inside the capture: the case that aborted under cudaMallocAsync
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("injected capture failure")
        return out

    cuda_tts.patch.mode = "graphs"
    try:
        monkeypatch.setattr(lean, "talker_pass", failing_inside_the_capture)
        with caplog.at_level(logging.WARNING, logger="morph.decode.runner"):
            first = cuda_tts.clone("The capture fails this time.", voices["xvector"], "English", SETTINGS)
        assert first.size > 0 and cuda_tts.patch.last_run["mode"] == "graphs"
        assert any("could not prepare the graphs decoder" in r.message for r in caplog.records)
        monkeypatch.undo()
        again = cuda_tts.clone("The capture fails this time.", voices["xvector"], "English", SETTINGS)
        assert len(cuda_tts.patch.loop.graphs) == 1  # captured now: nothing stayed degraded
        assert again.size == first.size
    finally:
        cuda_tts.patch.mode = "auto"


def test_garbage_holding_a_graph_of_the_pool_is_not_collected_inside_a_capture():
    """A graph of the pool left in a reference cycle, and a step that allocates enough Python objects to set the
    collector off many times over: freed in the middle of the capture, the graph would take the process down. The
    collector runs in the warm-up, never inside the capture."""
    pool = torch.cuda.graph_pool_handle()
    x = torch.ones(1024, device="cuda")
    cycle = [graphs.capture(lambda: x * 2, pool)]
    cycle.append(cycle)
    del cycle
    collector_on, collections = [], {True: 0, False: 0}  # capturing -> collections started

    def step():
        collector_on.append(gc.isenabled())
        junk = [[i] for i in range(100_000)]
        del junk
        return x + 1

    def watch(phase, info):
        if phase == "start":
            collections[torch.cuda.is_current_stream_capturing()] += 1

    gc.callbacks.append(watch)
    try:
        entry = graphs.capture(step, pool)
    finally:
        gc.callbacks.remove(watch)
    assert collector_on == [True, True, False]  # warmed up as usual, captured with the collector paused
    assert collections[False] > 0 and collections[True] == 0
    assert gc.isenabled()  # ... and put back after
    x.fill_(3)
    assert torch.equal(entry.replay(), torch.full_like(x, 4))


def test_an_injected_capture_oom_reaches_batch_halving(cuda_tts, voices, monkeypatch, caplog):
    cuda_tts.release_device_state()
    real_get = graphs.GraphCache.get

    def get(self, key, step):
        # the decode's graphs only (key = ("frame" or "rows", seq_groups, batch, ...)): the live codec's and the
        # prefill's graphs, keyed by int tuples, are GraphCaches too, and their failures are not this test's
        if isinstance(key[0], str) and key[2] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected during capture)")
        return real_get(self, key, step)

    monkeypatch.setattr(graphs.GraphCache, "get", get)
    lines = [Line(f"Line number {i} of the halving test.", voices["xvector"], "English") for i in range(4)]
    cuda_tts.patch.mode = "graphs"
    try:
        with caplog.at_level(logging.WARNING):
            audio = BatchTTS(cuda_tts).render(lines, SETTINGS, batch_size=4)
    finally:
        cuda_tts.patch.mode = "auto"
    assert len(audio) == 4 and all(a.size > 0 for a in audio)
    assert any("retrying in batches of 2" in r.message for r in caplog.records)


def test_twenty_runs_in_a_row_do_not_grow_allocated_memory(cuda_tts, voices):
    cuda_tts.patch.mode = "graphs"
    try:
        after = []
        for i in range(20):
            cuda_tts.clone("Twenty runs in a row, and memory stays flat.", voices["icl"], "English",
                           GenerationSettings(seq_groups=5, seed=i, max_new_tokens=20))
            torch.cuda.synchronize()
            after.append(torch.cuda.memory_allocated())
    finally:
        cuda_tts.patch.mode = "auto"
    assert max(after[1:]) - after[0] <= 1 << 20, after
