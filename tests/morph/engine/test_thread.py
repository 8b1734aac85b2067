"""Requests through one running continuous batch (morph/engine/thread.py LiveEngine; tiny model, CPU, fp32, mode
"lean"): requests join while others run, each one's audio comes in order as it is made and joins to the take it has
alone, a request's prompt is built on the thread that submits it, a cancel frees its rows, settings that differ get
a batch of their own, and the queue is bounded."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np
import pytest
import torch

import morph.engine.engine
from morph.errors import Busy, EngineFailed, reason
from morph.engine.thread import LiveEngine, fatal
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling
from tests.audio_compare import assert_audio_close
from tests.serve_faults import CUDA_ASSERT, fault_runner

FRAME = 1920  # samples a frame at 24 kHz
TIMEOUT = 120


def settings(frames, seed=7, **kw):
    return GenerationSettings(seq_groups=5, do_sample=False, subtalker=Sampling(do_sample=False),
                              max_new_tokens=frames, seed=seed, **kw)


class Sink:
    """A request's callbacks: its chunks, and how it ended."""

    def __init__(self, on_first=None):
        self.chunks, self.error, self.done = [], None, threading.Event()
        self.on_first = on_first

    def chunk(self, wav):
        self.chunks.append(wav)
        if len(self.chunks) == 1 and self.on_first is not None:
            self.on_first()

    def end(self, error):
        self.error = error
        self.done.set()

    def audio(self):
        assert self.done.wait(TIMEOUT), "the request never ended"
        assert self.error is None, self.error
        return np.concatenate(self.chunks)


@pytest.fixture(params=[None, 1 << 20], ids=["dense", "paged"])
def engine(lean, request):
    """A live engine of four slots, its keys and values dense or in a 1 MiB paged pool (a few dozen pages)."""
    e = LiveEngine(lean, width=4, max_frames=64, max_prompt=400, kv_cache_bytes=request.param)
    yield e
    e.close()


def submit(engine, text, voice, frames, sink, seed=7, **kw):
    return engine.submit(Line(text, voice, "English"), settings(frames, seed, **kw), sink.chunk, sink.end)


def test_requests_join_a_running_batch_and_each_gets_its_own_take(engine, lean, voices):
    """B and C are sent once A's first audio is out (A still runs): they join A's batch, which was built once; each
    request's chunks come before its end and join to the take the request has rendered alone (its own random
    stream), to rounding."""
    late, runners = [Sink(), Sink()], []
    texts = ["one two three four five six.", "seven eight.", "nine ten eleven."]

    def send_late():
        runners.append(engine.engine._runner)
        submit(engine, texts[1], voices["xvec"], 12, late[0], seed=3)
        submit(engine, texts[2], voices["icl"], 20, late[1], seed=4)

    first = Sink(on_first=send_late)
    submit(engine, texts[0], voices["icl"], 40, first, seed=2)
    got = [s.audio() for s in (first, *late)]
    alone = [BatchTTS(lean).render([Line(t, v, "English")], settings(f, seed), batch_size=1)[0]
             for t, v, f, seed in zip(texts, (voices["icl"], voices["xvec"], voices["icl"]), (40, 12, 20), (2, 3, 4))]
    for g, a in zip(got, alone, strict=True):
        assert_audio_close(g, a, rel=1e-4)
    assert got[0].size <= 40 * FRAME and len(first.chunks) >= 3
    assert engine.engine._runner is runners[0] and engine.stats()["rows_in_batch"] == 0
    assert (engine.engine.kv_cache_bytes is None) == ("peak_pages" not in engine.engine._runner.batch.sched.stats())


def test_a_requests_prompt_is_tokenized_and_built_in_submit_and_the_engines_thread_only_batches_it(engine, lean,
                                                                                                   voices, monkeypatch):
    """Joining costs the loop nothing but the batching: the caller's thread tokenizes (with a tokenizer of its own)
    and embeds the prompt; the engine's thread tokenizes nothing and builds no prompt."""
    import morph.engine.runner as runner

    calls = []

    def watched(owner, name):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, **k: (calls.append((name, threading.current_thread().name)),
                                                          real(*a, **k))[1])

    for name in ("row_prompts", "batch_inputs"):
        watched(runner, name)
    watched(type(lean.tts), "_tokenize_texts")
    sink = Sink()
    submit(engine, "a line of its own.", voices["icl"], 12, sink)
    sink.audio()
    here = threading.current_thread().name
    assert {call for call in calls if call[1] != "morph-engine"} == {("_tokenize_texts", here), ("row_prompts", here)}
    assert {call for call in calls if call[1] == "morph-engine"} == {("batch_inputs", "morph-engine")}


def test_a_cancelled_request_stops_at_once_and_frees_its_rows(engine, voices):
    """A request cancelled after its first chunk hands out nothing more and never ends; its slot is free for the
    next request, which runs whole."""
    sink = Sink()
    request = None

    def cancel():
        engine.cancel(request)

    sink.on_first = cancel
    request = submit(engine, "a long line that would run for many frames.", voices["xvec"], 64, sink)
    after = Sink()
    submit(engine, "and then another.", voices["xvec"], 10, after)
    assert after.audio().size <= 10 * FRAME
    assert not sink.done.is_set() and len(sink.chunks) == 1 and request.status == "cancelled"
    stats = engine.stats()
    assert stats["rows_in_batch"] == stats["rows_waiting"] == stats["rows_live"] == stats["cache_slots"] == 0


def test_other_settings_get_a_batch_of_their_own(engine, voices):
    """A request sampling otherwise waits for the batch before it to drain, then runs in one built for it."""
    runners = []
    a, b = Sink(on_first=lambda: runners.append(engine.engine._runner)), Sink()
    submit(engine, "first setting.", voices["xvec"], 16, a)
    submit(engine, "second setting.", voices["xvec"], 16, b, repetition_penalty=1.2)
    a.audio()
    b.audio()
    assert runners[0].settings.repetition_penalty == 1.05 and engine.engine._runner.settings.repetition_penalty == 1.2


def test_the_queue_is_bounded_and_limits_name_their_field(lean, voices):
    engine, gate = LiveEngine(lean, width=1, max_frames=32, max_prompt=400, max_waiting=2), threading.Event()
    try:
        with pytest.raises(ValueError, match="max_new_tokens is 33.*at most 32"):
            submit(engine, "too long.", voices["xvec"], 33, Sink())
        with pytest.raises(ValueError, match="text is empty"):
            submit(engine, "  ", voices["xvec"], 8, Sink())
        gate, running = threading.Event(), threading.Event()
        held = Sink(on_first=lambda: (running.set(), gate.wait(TIMEOUT)))  # holds the engine's thread
        submit(engine, "the first.", voices["xvec"], 16, held)
        assert running.wait(TIMEOUT)
        sinks = [Sink(), Sink()]
        for s in sinks:
            submit(engine, "one more.", voices["xvec"], 4, s)
        engine.engine.row_seconds = 3.5  # a row's time in the batch: one slot frees about every 3.5 s
        with pytest.raises(Busy, match="2 rows are waiting") as busy:
            submit(engine, "one too many.", voices["xvec"], 4, Sink())
        assert busy.value.retry_after == 4  # one row over the queue's bound, one slot: ceil(3.5)
        engine.engine.row_seconds = 1e4
        with pytest.raises(Busy, match="try again in 60 s") as busy:
            submit(engine, "one too many.", voices["xvec"], 4, Sink())
        assert busy.value.retry_after == 60  # the most OpenAI's client waits
        gate.set()
        for s in (held, *sinks):
            s.audio()
    finally:
        gate.set()
        engine.close()


def test_close_ends_the_waiting_requests_with_an_error(lean, voices):
    engine = LiveEngine(lean, width=1, max_frames=32, max_prompt=400)
    gate, running = threading.Event(), threading.Event()
    held, waiting = Sink(on_first=lambda: (running.set(), gate.wait(TIMEOUT))), Sink()
    submit(engine, "the first.", voices["xvec"], 8, held)
    assert running.wait(TIMEOUT)  # the first is in the batch, its callback holding the engine's thread
    submit(engine, "the second.", voices["xvec"], 8, waiting)
    closer = threading.Thread(target=engine.close)
    closer.start()
    while not waiting.done.is_set():  # close ends the waiting one before it joins the engine's thread
        waiting.done.wait(0.05)
    gate.set()
    closer.join(TIMEOUT)
    assert "closed before this request ran" in str(waiting.error)
    held.audio()


def test_calls_run_on_the_engines_thread_between_frames(engine, voices):
    """Model work handed to the engine (a voice being made) runs on its thread while it idles, and between two frames
    while a request runs: it does not wait for the request's end."""
    idle = engine.call(lambda: (threading.current_thread().name, threading.current_thread().daemon)).result(TIMEOUT)
    assert idle == ("morph-engine", True)  # a thread left running after close does not keep the process alive
    calls = []
    sink = Sink(on_first=lambda: calls.append(engine.call(lambda: len(sink.chunks))))
    submit(engine, "a line long enough for many chunks.", voices["xvec"], 64, sink)
    sink.audio()
    assert calls and calls[0].result(TIMEOUT) < len(sink.chunks)  # it ran before the request's last chunk
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.call(lambda: None)


def test_out_of_memory_narrows_the_batch_and_runs_again_the_rows_that_handed_nothing(lean, voices, monkeypatch):
    """The batch runs out of memory once, with a streaming request and one that has just joined: the first has
    handed audio out, so it fails; the second runs again in a batch of half the width and gets the take it has
    alone."""
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(morph.engine.engine, "RowRunner", fault_runner(oom, times=1))
    engine = LiveEngine(lean, width=4, max_frames=64, max_prompt=400)
    try:
        again = Sink()
        streamed = Sink(on_first=lambda: submit(engine, "FAIL, then again.", voices["xvec"], 12, again, seed=3))
        submit(engine, "a long line that would run for many frames.", voices["xvec"], 64, streamed)
        got = again.audio()
        assert streamed.done.wait(TIMEOUT) and "ran out of memory" in str(streamed.error)
        assert "after this request's audio had begun" in str(streamed.error)
        assert engine.stats()["width"] == 2  # half the slots the batch had
        alone = BatchTTS(lean).render([Line("FAIL, then again.", voices["xvec"], "English")], settings(12, 3),
                                      batch_size=1)[0]
        assert_audio_close(got, alone, rel=1e-4)
    finally:
        engine.close()


@pytest.mark.parametrize("error,is_fatal", [
    (RuntimeError(CUDA_ASSERT), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
    (ValueError("a bug"), False),
])
def test_which_errors_leave_the_cuda_context_unusable(error, is_fatal):
    assert fatal(error) is is_fatal


def test_a_fatal_error_ends_every_request_and_refuses_the_next(lean, voices, monkeypatch, caplog):
    """A device-side assert: the request in the batch and the one waiting end at once with EngineFailed, which says
    the process must be restarted; the failure is logged as critical, naming the engine, with its traceback; the
    owner is told once, and what comes after is refused, naming who asked."""
    error = RuntimeError(CUDA_ASSERT)
    monkeypatch.setattr(morph.engine.engine, "RowRunner", fault_runner(error))
    told = []
    engine = LiveEngine(lean, width=1, max_frames=32, max_prompt=400, on_fatal=told.append, who="Serve 1")
    gate = threading.Event()
    try:
        held = engine.call(lambda: gate.wait(TIMEOUT))  # the engine's thread waits until both are queued
        failing, waiting = Sink(), Sink()
        submit(engine, "FAIL in the batch.", voices["xvec"], 16, failing)
        submit(engine, "waiting.", voices["xvec"], 8, waiting)
        gate.set()
        held.result(TIMEOUT)
        for sink in (failing, waiting):
            assert sink.done.wait(TIMEOUT) and isinstance(sink.error, EngineFailed)
        until = time.monotonic() + TIMEOUT
        while not told and time.monotonic() < until:  # the owner is told once the requests have their answers
            time.sleep(0.01)
        assert str(waiting.error) == (f"the speech engine failed ({reason(error)}) and cannot go on; the process "
                                      "must be restarted") and told == [waiting.error]
        [record] = [r for r in caplog.records if r.levelname == "CRITICAL"]
        assert record.getMessage() == "Serve 1: the engine failed and cannot go on" and record.exc_info[1] is error
        with pytest.raises(EngineFailed, match="^Request 9: the speech engine failed .*device-side assert"):
            engine.submit(Line("after.", voices["xvec"], "English"), settings(8), Sink().chunk, Sink().end,
                          who="Request 9")
        with pytest.raises(EngineFailed, match="^Serve 1: the speech engine failed"):
            engine.call(lambda: None)
    finally:
        gate.set()
        engine.close()


def hold_thread(engine, gate):
    """A call that holds the engine's thread until `gate` is set, once it runs; its future gives True then."""
    began = threading.Event()
    running = engine.call(lambda: (began.set(), gate.wait(TIMEOUT))[1])
    assert began.wait(TIMEOUT)
    return running


def test_close_ends_the_calls_not_yet_run_and_leaves_behind_a_thread_that_does_not_stop(lean, caplog):
    """A call holds the engine's thread past close's timeout: close returns after it, saying so, and the call queued
    behind it ends with an error naming the engine."""
    engine = LiveEngine(lean, width=1, max_frames=32, max_prompt=400, who="Serve 2")
    gate = threading.Event()
    try:
        running = hold_thread(engine, gate)
        queued = engine.call(lambda: "ran")
        caplog.set_level(logging.WARNING, "morph")
        started = time.perf_counter()
        engine.close(timeout=1)
        assert time.perf_counter() - started < 10
        assert str(queued.exception(TIMEOUT)) == "Serve 2: the engine was closed"
        assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
            "Serve 2: the engine's thread had not stopped 1 s after close; leaving it"]
    finally:
        gate.set()
    assert running.result(TIMEOUT) is True


def test_abort_ends_the_calls_not_yet_run_with_its_error(lean):
    engine = LiveEngine(lean, width=1, max_frames=32, max_prompt=400)
    gate = threading.Event()
    try:
        running = hold_thread(engine, gate)
        queued = engine.call(lambda: "ran")
        error = RuntimeError("drained")
        engine.abort(error)
        assert queued.exception(TIMEOUT) is error
        gate.set()
        assert running.result(TIMEOUT) is True
    finally:
        gate.set()
        engine.close()


def test_a_live_row_joins_at_the_next_frame_and_its_chunks_start_small(lean, voices):
    """A server's batch of two slots, three requests: C waits for A's slot and joins at the frame after A ends (not at
    a FIRST_GRID mark); each request's chunks grow from FIRST_CHUNK frames (1 for C, which joined at an odd frame) to
    LIVE_CHUNK, each ending on a mark of its size and handed out as soon as its frames are made (the host's lag is
    none on the CPU); its last chunk is its rest. Each request's chunks joined are the take it renders alone, to
    rounding, and the engine measured its pace."""
    texts, ends = ["alpha.", "beta beta.", "gamma gamma gamma."], [5, 30, 12]
    engine = LiveEngine(lean, width=2, max_frames=32, max_prompt=400)
    engine.engine.stop = lambda row: min(row.limit, ends[texts.index(row.text)])
    engine.engine.pace.budget = math.inf  # what a frame takes on this CPU is not what this test is about
    sinks, at = [Sink(), Sink(), Sink()], [[], [], []]
    try:
        with engine.engine.cv:  # the three are queued before the engine's thread takes the first
            for text, sink, log in zip(texts, sinks, at, strict=True):
                sink.chunk = lambda wav, sink=sink, log=log: (log.append(engine.engine._runner.batch.sched.frame),
                                                              Sink.chunk(sink, wav))
                submit(engine, text, voices["xvec"], 32, sink)
        got = [s.audio() for s in sinks]
        pace = engine.engine.pace.ms
    finally:
        engine.close()
    frames = [[c.size // FRAME for c in s.chunks] for s in sinks]
    assert frames == [[2, 2, 1], [2, 2, 4, 8, 14], [1, 2, 2, 2, 4, 1]]
    # frames run before each chunk was handed out: a chunk as soon as its frames are made, A's rest after its end
    assert at[0] == [2, 4, 5] and at[1][:4] == [2, 4, 8, 16]
    assert at[2] == [ends[0] + n for n in (1, 3, 5, 7, 11, 12)]  # C's first frame is the one after A's last
    alone = BatchTTS(lean)
    alone.stop = engine.engine.stop
    for g, text in zip(got, texts, strict=True):
        assert_audio_close(g, alone.render([Line(text, voices["xvec"], "English")], settings(32, 7),
                                           batch_size=1)[0], rel=1e-4)
    assert set(pace) == {1, 2}  # the steps' widths: two rows, then B alone


def test_requests_that_come_together_join_at_once_in_slices_of_the_rows_the_engine_captured(lean, voices,
                                                                                          monkeypatch):
    """Five requests queued together join at the same frame, prefilled in slices of at most LIVE_ROWS[-1] rows: the
    buckets LiveEngine.ready captured (a slice of four would capture in the requests' path)."""
    import morph.decode.prefill_graphs as prefill_graphs

    slices, real = [], prefill_graphs.lean_prefill
    monkeypatch.setattr(prefill_graphs, "lean_prefill",
                        lambda embeds, *a, **k: (slices.append(embeds.shape[0]), real(embeds, *a, **k))[1])
    engine = LiveEngine(lean, width=8, max_frames=32, max_prompt=400)
    engine.engine.pace.budget = math.inf
    firsts = []
    sinks = [Sink(on_first=lambda: firsts.append(engine.engine._runner.batch.sched.frame)) for _ in range(5)]
    try:
        with engine.engine.cv:  # queued before the engine's thread takes the first
            for i, sink in enumerate(sinks):
                submit(engine, f"line {i} of five.", voices["xvec"], 8, sink)
        for sink in sinks:
            sink.audio()
    finally:
        engine.close()
    assert slices == [2, 2, 1]
    assert len(firsts) == 5 and len(set(firsts)) == 1


def test_a_row_the_pace_does_not_admit_waits_for_a_row_to_end_and_then_runs(lean, voices):
    """The engine has measured a frame of two rows at 5 s, over the budget, and of one row under it: of two requests
    sent together A joins alone, and B, which would widen the step, waits for A's end, then runs whole."""
    engine = LiveEngine(lean, width=2, max_frames=32, max_prompt=400)
    # one row's figure is measured again as A runs, which even a loaded CPU keeps under this budget of 1 s
    engine.engine.pace.ms, engine.engine.pace.budget = {1: 1.0, 2: 5000.0}, 1000.0
    first = []
    sinks = [Sink(on_first=lambda name=name: first.append((name, engine.engine._runner.batch.sched.frame)))
             for name in "ab"]
    try:
        with engine.engine.cv:  # both are queued before the engine's thread takes the first
            for text, sink in zip(["alpha alpha.", "beta."], sinks, strict=True):
                submit(engine, text, voices["xvec"], 12, sink)
        got = [s.audio() for s in sinks]
    finally:
        engine.close()
    assert got[0].size == 12 * FRAME and got[1].size == 12 * FRAME
    assert [name for name, _ in first] == ["a", "b"] and first[1][1] >= 12  # b's first frame came after a's last
