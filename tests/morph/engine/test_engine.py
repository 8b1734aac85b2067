"""morph/engine/engine.py's policy without a model: a scripted runner stands in for the batch (each row runs for its
limit in frames, `width` at a time, in the order the engine hands them out). Requests run in the order submitted and
end once every row is in; a row with other settings, or one needing more cache than the batch holds, waits for a
batch built for it; a cancel drops a request's waiting rows and ends its running ones; out of memory halves the
width and runs again the rows that handed nothing, fails a request whose audio had begun, and names the row that does
not fit alone; other errors fail the requests in the batch and the engine goes on; a caller's exception and a lost
CUDA context propagate; a preempted row runs first again. (Real batches: tests/morph/engine/test_thread.py and the
golden codes.)"""

from __future__ import annotations

import logging
import types

import pytest
import torch

import morph.engine.engine
from morph.engine.engine import Engine
from morph.engine.request import Request
from morph.lines.line import Row
from morph.settings import GenerationSettings, pool_pages, requeue_pool_pages

OOM = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class Script:
    """What the scripted runners did: each build's (width, need, pages, overcommit) and all its arguments (`runners`),
    each run's `ahead`, every frame's live rows, how each run of a runner ended (`ends`), and a fault to raise at a
    frame (`fail`: frame number -> exception); `lookahead`: rows a runner takes beyond its free slots (a group built
    ahead, taken but in no slot yet); `after_take`: called each time rows were taken, before their first frame."""

    def __init__(self):
        self.builds, self.frames, self.ends, self.fail, self.preempt = [], [], [], {}, {}
        self.runners, self.aheads, self.lookahead, self.after_take = [], [], 0, None


def scripted(script: Script):
    class Runner:
        def __init__(self, tts, settings, width, need, prompt, stop, on_row, audio, on_chunk, pages, overcommit, pace):
            script.builds.append((settings.temperature, width, need, pages, overcommit))
            script.runners.append(dict(tts=tts, width=width, need=need, prompt=prompt, audio=audio, on_chunk=on_chunk, pages=pages,
                                       overcommit=overcommit, pace=pace))
            self.width, self.stop, self.on_row, self.on_chunk = width, stop, on_row, on_chunk
            self.live: dict[Row, int] = {}  # row -> frames left
            self.pending: list[Row] = []  # taken, in no slot yet
            self.lo: dict[Row, int] = {}  # row -> its first cache slot: 10 prompt slots before it joined
            # the batch the engine reads its figures from: the rows in slots, and the cache position
            self.batch = types.SimpleNamespace(live={}, position=100)
            self.running = False

        def cancel(self, rows):
            self.pending = [r for r in self.pending if r not in rows]
            for row in rows:
                if row in self.live:
                    self.live[row] = 0

        def step(self, take, before_frame, put_back, ahead):
            if not self.running:
                script.aheads.append(ahead)
                self.running = True
            try:
                stepped = self._frame(take, before_frame, put_back)
            except BaseException as e:
                script.ends.append(type(e).__name__)
                self.running = False
                raise
            if not stepped:
                script.ends.append("idle")
                self.running = False
            return stepped

        def close(self):
            script.ends.append("closed")
            self.running = False

        def _frame(self, take, before_frame, put_back):
            taken = take(self.width + script.lookahead - len(self.live) - len(self.pending))
            self.pending += [row for row, _ in taken]
            if taken and script.after_take is not None:
                script.after_take()
            while self.pending and len(self.live) < self.width:
                row = self.pending.pop(0)
                self.live[row], self.lo[row] = self.stop(row), self.batch.position - 10
            if not self.live:
                return False
            self.batch.live = {slot: types.SimpleNamespace(name=row, lo=self.lo[row])
                               for slot, row in enumerate(self.live)}
            before_frame(len(self.live))
            frame = len(script.frames)
            script.frames.append(sorted(r.text for r in self.live))
            if frame in script.fail:
                raise script.fail.pop(frame)
            if frame in script.preempt:
                text = script.preempt.pop(frame)
                row = next(r for r in self.live if r.text == text)
                del self.live[row]
                put_back((row, 0))
            self.batch.position += 1
            for row in list(self.live):
                if self.on_chunk is not None:
                    self.on_chunk(row, f"chunk of {row.text}")
                self.live[row] -= 1
                if self.live[row] <= 0:
                    del self.live[row]
                    self.on_row(row, f"audio of {row.text}")
            return True

    return Runner


def run(engine, after_frame=None) -> None:
    """Step the engine until it is idle, after_frame() after each frame (as the server's thread runs its calls)."""
    while engine.step():
        if after_frame is not None:
            after_frame()


@pytest.fixture
def script(monkeypatch):
    s = Script()
    monkeypatch.setattr(morph.engine.engine, "RowRunner", scripted(s))
    return s


TTS = types.SimpleNamespace(patch=types.SimpleNamespace(resolved_mode=lambda device: "lean"),
                            device=torch.device("cpu"))


class Sink:
    def __init__(self, restart=True):
        self.rows, self.chunks, self.ends, self.restartable = [], [], [], restart
        self.audio, self.chunk_audio, self.asked = [], [], []  # (row, what it was handed); the rows restart was asked

    def request(self, texts, frames=2, prompt=10, temperature=0.9, stream=False):
        limits = frames if isinstance(frames, list) else [frames] * len(texts)
        rows = [Row(i, 0, t, None, f"Test (line {t})", f) for i, (t, f) in enumerate(zip(texts, limits, strict=True))]
        return Request(rows, list(range(len(rows))), [prompt] * len(rows),
                       GenerationSettings(temperature=temperature), self._row, self.ends.append,
                       self._chunk if stream else None, self._restart)

    def _row(self, row, audio):
        self.rows.append(row.text)
        self.audio.append((row.text, audio))

    def _chunk(self, row, wav):
        self.chunks.append(row.text)
        self.chunk_audio.append((row.text, wav))

    def _restart(self, rows):
        self.asked.append([r.text for r in rows])
        return self.restartable


def test_requests_run_in_order_and_each_ends_once_when_its_rows_are_in(script):
    engine = Engine(TTS, 2, "Test")
    a, b = Sink(), Sink()
    first, second = engine.submit(a.request("ab", frames=1)), engine.submit(b.request("cd", frames=1))
    run(engine)
    assert script.frames == [["a", "b"], ["c", "d"]]
    assert a.rows == ["a", "b"] and b.rows == ["c", "d"] and a.ends == b.ends == [None]
    assert first.status == second.status == "done" and len(script.builds) == 1


def test_a_request_with_other_settings_waits_for_a_batch_of_its_own(script, caplog):
    engine = Engine(TTS, 4, "Test")
    a, b, c = Sink(), Sink(), Sink()
    engine.submit(a.request("a", frames=3))
    engine.submit(b.request("b", frames=1, temperature=0.5))
    engine.submit(c.request("c", frames=1))
    run(engine)
    assert script.frames == [["a"]] * 3 + [["b"], ["c"]]  # c, though it samples as a does, comes after b
    assert [t for t, *_ in script.builds] == [0.9, 0.5, 0.9]
    assert a.ends == b.ends == c.ends == [None] and caplog.records == []  # a rebuild is no failure


def test_a_render_batch_is_sized_to_its_rows_and_built_again_for_a_larger_one(script):
    engine = Engine(TTS, 2, "Test", overcommit=True)
    sink = Sink()
    engine.submit(sink.request("ab", frames=4, prompt=20))  # 20 + 4 + 1 slots a row
    run(engine)
    engine.submit(sink.request("c", frames=4, prompt=10))  # smaller: the batch holds it as built
    engine.submit(sink.request("d", frames=4, prompt=30))  # larger: a batch built for it
    run(engine)
    assert [(need, over) for _, _, need, _, over in script.builds] == [(25, True), (35, True)]
    # an overcommitted pool is sized for the share of their frames the rows are likely to speak: (prompt, frames)
    assert [pages for _, _, _, pages, _ in script.builds] == [requeue_pool_pages([(20, 4)] * 2, 2),
                                                              requeue_pool_pages([(30, 4)], 2)]
    assert script.frames[4:] == [["c"]] * 4 + [["d"]] * 4  # d joins only after c's batch drained
    engine.submit(sink.request("f", frames=1, prompt=33))  # as many slots, a longer prompt (its text table)
    run(engine)
    assert [(r["need"], r["prompt"]) for r in script.runners] == [(25, 20), (35, 30), (35, 33)]
    live = Engine(TTS, 2, "Test", need=(64, 32))  # a server's: every row up to need, dense
    live.submit(sink.request("e"))
    run(live)
    assert script.builds[-1][2:4] == (64, None) and script.runners[-1]["prompt"] == 32


def test_a_cancel_drops_waiting_rows_ends_running_ones_and_tells_nobody(script):
    engine = Engine(TTS, 1, "Test")
    a, b = Sink(), Sink()
    running = engine.submit(a.request("xy", frames=3))

    def cancel_after_the_first_frame():
        if len(script.frames) == 1:
            engine.cancel(running)

    engine.submit(b.request("z", frames=1))
    run(engine, cancel_after_the_first_frame)
    assert running.status == "cancelled" and a.ends == [] and a.rows == []
    assert script.frames == [["x"], ["x"], ["z"]]  # x ended at the frame the engine saw the cancel, y never ran
    assert b.ends == [None]


def test_out_of_memory_halves_the_width_and_runs_again_the_rows_that_handed_nothing(script, caplog):
    engine = Engine(TTS, 4, "Test")
    quiet, streamed = Sink(), Sink(restart=False)
    engine.submit(quiet.request("ab", frames=2))
    engine.submit(streamed.request("c", frames=2, stream=True))
    script.fail[0] = OOM
    run(engine)
    assert engine.width == 2 and engine.backoffs == 1
    assert [r.getMessage() for r in caplog.records] == ["Test: out of GPU memory with a batch of 4 rows; retrying in "
                                                        "batches of 2 (2 rows run again)"]
    assert script.frames == [["a", "b", "c"], ["a", "b"], ["a", "b"]]  # c's chunk was out: it fails
    assert quiet.ends == [None] and sorted(quiet.rows) == ["a", "b"]
    assert "after this request's audio had begun" in str(streamed.ends[0])


def test_out_of_memory_with_one_row_names_it(script):
    engine = Engine(TTS, 1, "Test")
    sink = Sink()
    request = engine.submit(sink.request("a", frames=2))
    script.fail[0] = OOM
    run(engine)
    assert request.status == "failed"
    assert str(sink.ends[0]).startswith("Test (line a): the GPU ran out of memory rendering a single row (1 "
                                        "characters, up to 2 frames): OutOfMemoryError: CUDA out of memory")


def test_another_error_fails_the_batchs_requests_and_the_engine_goes_on(script):
    engine = Engine(TTS, 1, "Test")
    a, b = Sink(), Sink()
    engine.submit(a.request("a", frames=2))
    engine.submit(b.request("b", frames=1))
    script.fail[0] = ValueError("a bug")
    run(engine)
    assert isinstance(a.ends[0], ValueError) and b.ends == [None] and engine.width == 1


def test_a_lost_cuda_context_and_the_callers_exception_propagate(script):
    engine = Engine(TTS, 1, "Test")
    engine.submit(Sink().request("a"))
    script.fail[0] = RuntimeError("CUDA error: device-side assert triggered")
    with pytest.raises(RuntimeError, match="device-side assert"):
        run(engine)

    class Stop(Exception):
        pass

    def stop():
        raise Stop()

    engine.submit(Sink().request("b"))
    with pytest.raises(Stop):
        run(engine, stop)


def test_a_preempted_row_runs_first_again(script):
    engine = Engine(TTS, 2, "Test", overcommit=True)
    sink = Sink()
    engine.submit(sink.request("abc", frames=2))
    script.preempt[0] = "b"
    run(engine)
    assert script.frames == [["a", "b"], ["a", "b"], ["b", "c"], ["c"]]  # b, put back, joins before c
    assert sink.rows == ["a", "b", "c"] and sink.ends == [None]


def test_a_sink_that_fails_ends_its_request_with_that_error(script):
    engine = Engine(TTS, 2, "Test")
    good = Sink()
    bad = Sink()
    request = bad.request("ab", frames=1)
    request.on_row = lambda row, audio: 1 / 0
    engine.submit(request)
    engine.submit(good.request("c", frames=1))
    run(engine)
    assert isinstance(bad.ends[0], ZeroDivisionError) and good.ends == [None]


def test_a_default_batch_decodes_audio_in_a_pool_sized_to_its_rows_without_overcommit_or_groups_ahead(script):
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    engine.submit(sink.request("ab", frames=[1, 2], prompt=20))
    run(engine)
    built = script.runners[0]
    assert built["tts"] is TTS and built["audio"] and not built["overcommit"] and script.aheads == [False]
    assert built["pace"] is None  # a render's batch runs throughput first: no pace holds its rows back
    assert built["pages"] == pool_pages([20 + 1 + 1, 20 + 2 + 1], 2)  # each row: its prompt, frames and EOS slot
    assert sink.audio == [("a", "audio of a"), ("b", "audio of b")]  # each row's own audio, as it ends
    codes = Engine(TTS, 2, "Test", ahead=True, audio=False)
    codes.submit(Sink().request("c"))
    run(codes)
    assert not script.runners[1]["audio"] and script.aheads == [False, True]


def test_an_engine_refuses_a_model_loaded_for_eager_mode():
    eager = types.SimpleNamespace(patch=types.SimpleNamespace(resolved_mode=lambda device: "eager"),
                                  device=torch.device("cpu"))
    with pytest.raises(ValueError) as refused:
        Engine(eager, 2, "Test")
    assert str(refused.value) == ("Test: the engine runs the continuous batch, which runs the lean layers; load the "
                                  "model with mode fused, graphs or lean (eager runs upstream's static batches only)")


def test_a_servers_batch_with_a_cache_budget_runs_in_the_pages_that_budget_holds(script, monkeypatch):
    monkeypatch.setattr(morph.engine.engine, "budget_pages",
                        lambda tts, nbytes: nbytes // 1000 if tts is TTS else None)  # 1000 bytes a page
    engine = Engine(TTS, 2, "Test", need=(64, 32), kv_cache_bytes=8000)
    engine.submit(Sink().request("a"))
    run(engine)
    assert script.builds == [(0.9, 2, 64, 8, False)]
    assert script.runners[0]["pace"] is engine.pace is not None  # a server's is paced, by figures kept across batches


def test_a_row_needing_exactly_what_the_batch_holds_joins_it_without_a_rebuild(script, caplog):
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    engine.submit(sink.request("a", frames=2, prompt=10))
    run(engine)
    engine.submit(sink.request("b", frames=2, prompt=10))  # the same 13 slots
    run(engine)
    assert len(script.builds) == 1 and sink.rows == ["a", "b"]
    engine.release()  # the batch goes: the next run builds one
    engine.submit(sink.request("c", frames=2, prompt=10))
    run(engine)
    assert len(script.builds) == 2 and sink.rows == ["a", "b", "c"] and sink.ends == [None] * 3
    assert caplog.records == []  # a batch released is built again, not failed over


def test_a_request_whose_keys_do_not_match_its_rows_is_refused_and_nothing_of_it_queued(script):
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    request = sink.request("ab")
    request.keys = [0]
    with pytest.raises(ValueError):
        engine.submit(request)
    assert engine.waiting_rows() == 0
    run(engine)
    assert script.builds == [] and sink.rows == [] and sink.ends == []


@pytest.mark.parametrize("error", [RuntimeError("no room for the pool"), OOM], ids=["error", "out-of-memory"])
def test_a_batch_that_fails_while_it_is_built_fails_its_request_and_the_engine_goes_on(script, monkeypatch, error):
    """Before any row is taken: the request the batch was built for fails (out of memory: once it has narrowed to one
    row), the next one runs; the engine never builds the same batch for ever."""
    import morph.engine.engine as engine_module

    built = []

    def failing_then_scripted(tts, settings, width, *rest):
        built.append(width)
        if settings.temperature == 0.5:
            raise error
        return scripted(script)(tts, settings, width, *rest)

    monkeypatch.setattr(engine_module, "RowRunner", failing_then_scripted)
    engine = Engine(TTS, 4, "Test")
    bad, good = Sink(), Sink()
    engine.submit(bad.request("a", temperature=0.5))  # one row: the next row waiting is another request's
    engine.submit(good.request("c"))
    run(engine)
    assert built == ([4, 4] if error is not OOM else [4, 2, 1, 1])
    assert len(bad.ends) == 1 and bad.ends[0] is not None and bad.rows == []
    assert good.rows == ["c"] and good.ends == [None] and engine.waiting_rows() == 0


def test_a_request_cancelled_while_it_waits_never_runs_and_is_not_told(script):
    engine = Engine(TTS, 2, "Test")
    a, b = Sink(), Sink()
    engine.submit(a.request("a", frames=1))
    waiting = engine.submit(b.request("b", frames=1, temperature=0.5))
    assert waiting.status == "waiting" and engine.waiting_rows() == 2
    engine.cancel(waiting)
    run(engine)
    assert script.frames == [["a"]] and waiting.status == "cancelled" and b.ends == [] and b.rows == []
    engine.cancel(waiting)  # twice: nothing more
    assert waiting.status == "cancelled" and a.ends == [None]


def test_a_cancel_ends_every_row_a_request_has_in_the_batch_at_the_next_frame(script):
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    request = engine.submit(sink.request("xy", frames=5))
    run(engine, lambda: engine.cancel(request) if len(script.frames) == 1 else None)
    assert script.frames == [["x", "y"], ["x", "y"]] and sink.rows == [] and sink.ends == []


def test_a_cancelled_row_taken_ahead_of_a_slot_leaves_the_batch(script):
    script.lookahead = 1  # the engine hands the runner a row more than it has slots: its group is built ahead
    engine = Engine(TTS, 1, "Test")
    sink = Sink()
    request = engine.submit(sink.request("xy", frames=3))
    seen = []

    def after_frame():
        seen.append(engine.stats()["rows_in_batch"])
        if len(script.frames) == 1:
            engine.cancel(request)

    run(engine, after_frame)
    assert seen == [2, 0] and script.frames == [["x"], ["x"]]  # y, taken, never had a slot; x ended at frame 1
    assert engine.stats() == dict(rows_live=0, rows_waiting=0, rows_in_batch=0, width=1, cache_slots=0)


def test_stats_after_a_step_give_its_frames_live_rows_and_cache_slots_while_rows_are_in_the_batch(script):
    engine = Engine(TTS, 2, "Test")
    a, b = Sink(), Sink()
    engine.submit(a.request("ab", frames=1))
    engine.submit(b.request("cde", frames=2))
    taken, figures = [], []
    script.after_take = lambda: taken.append(engine.stats())
    run(engine, lambda: figures.append(engine.stats()))
    # rows taken before their first frame: none is live yet, and no cache slot is counted
    assert taken[0] == dict(rows_live=0, rows_waiting=5 - 2, rows_in_batch=2, width=2, cache_slots=0)
    assert [f["rows_live"] for f in figures] == [0, 2, 0, 1, 0]  # ab ended; cd; cd ended; e; e ended
    # each live row's slots as its frame ran: its 10 prompt slots and the frames it had made
    assert figures[1] == dict(rows_live=2, rows_waiting=1, rows_in_batch=2, width=2, cache_slots=2 * 10)
    assert figures[3] == dict(rows_live=1, rows_waiting=0, rows_in_batch=1, width=2, cache_slots=10)
    assert engine.stats() == dict(rows_live=0, rows_waiting=0, rows_in_batch=0, width=2, cache_slots=0)


def test_a_rows_time_in_the_batch_moves_the_estimate_a_tenth_of_the_way(script, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(morph.engine.engine, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    engine = Engine(TTS, 1, "Test")
    assert engine.row_seconds == 5.0  # before any row: a server's first Retry-After
    engine.submit(Sink().request("ab", frames=3))

    def after_frame():
        clock[0] += 1.0  # a second a frame

    run(engine, after_frame)
    # a row joins in its first frame's step and ends in its third's: 2 s in the batch
    # a: 5 + (2 - 5) / 10 = 4.7; b: 4.7 + (2 - 4.7) / 10 = 4.43
    assert engine.row_seconds == pytest.approx(4.43)


def test_a_streaming_request_gets_each_rows_chunks_as_they_are_made_and_none_after_its_cancel(script):
    engine = Engine(TTS, 2, "Test")
    streamed, cancelled = Sink(), Sink()
    engine.submit(streamed.request("a", frames=2, stream=True))
    request = engine.submit(cancelled.request("b", frames=4, stream=True))
    run(engine, lambda: engine.cancel(request) if len(script.frames) == 1 else None)
    assert streamed.chunk_audio == [("a", "chunk of a")] * 2 and streamed.audio == [("a", "audio of a")]
    # frame 0's only: nothing is handed once the cancel is made, though b's row runs the next frame before it leaves
    assert cancelled.chunk_audio == [("b", "chunk of b")] and cancelled.audio == []
    assert script.frames == [["a", "b"], ["a", "b"]]


def test_a_failing_chunk_sink_ends_its_request_with_that_error_and_the_batch_goes_on(script):
    engine = Engine(TTS, 2, "Test")
    bad, good = Sink(), Sink()
    failing = bad.request("a", frames=3, stream=True)
    failing.on_chunk = lambda row, wav: 1 / 0
    engine.submit(failing)
    engine.submit(good.request("b", frames=3, stream=True))
    run(engine)
    assert failing.status == "failed" and isinstance(bad.ends[0], ZeroDivisionError) and len(bad.ends) == 1
    assert script.frames == [["a", "b"], ["a", "b"], ["b"]] and bad.rows == []  # a leaves the batch at the next frame
    assert good.chunks == ["b"] * 3 and good.ends == [None]


def test_out_of_memory_runs_again_only_the_rows_not_yet_in_each_once(script):
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    request = engine.submit(sink.request("abcd", frames=[1, 3, 3, 1]))
    script.fail[1] = OOM  # a is in; b and c run; d waits
    run(engine)
    assert sink.asked == [["b", "c", "d"]]  # the rows restart is asked about: those whose audio is not in
    assert script.frames == [["a", "b"], ["b", "c"]] + [["b"]] * 3 + [["c"]] * 3 + [["d"]]
    assert sink.rows == ["a", "b", "c", "d"] and sink.ends == [None] and request.status == "done"


def test_out_of_memory_runs_again_the_rows_of_every_request_in_the_batch(script):
    engine = Engine(TTS, 2, "Test")
    first, second = Sink(), Sink()
    engine.submit(first.request("a", frames=2))
    engine.submit(second.request("b", frames=2))
    script.fail[0] = OOM
    run(engine)
    assert script.frames == [["a", "b"], ["a"], ["a"], ["b"], ["b"]]
    assert first.ends == second.ends == [None] and first.rows == ["a"] and second.rows == ["b"]


def test_out_of_memory_alone_names_the_row_that_does_not_fit_not_one_already_in(script):
    engine = Engine(TTS, 1, "Test")
    sink = Sink()
    engine.submit(sink.request("ab", frames=[1, 2]))
    script.fail[1] = OOM  # b, alone
    run(engine)
    assert sink.rows == ["a"] and str(sink.ends[0]) == (
        "Test (line b): the GPU ran out of memory rendering a single row (1 characters, up to 2 frames): "
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; free VRAM (ComfyUI's Unload models), set "
        "max_new_tokens lower, shorten the text, or load the model in bf16")


def test_out_of_memory_after_a_requests_audio_began_says_why_it_is_not_run_again(script):
    engine = Engine(TTS, 2, "Test")
    sink = Sink(restart=False)
    engine.submit(sink.request("a", frames=3, stream=True))
    script.fail[1] = OOM
    run(engine)
    assert str(sink.ends[0]) == ("Test (line a): the GPU ran out of memory (OutOfMemoryError: CUDA out of memory. "
                                 "Tried to allocate 2.00 GiB) after this request's audio had begun, which a retry "
                                 "would hand out again; send it again, or set the batch size lower")


def test_another_error_keeps_the_width_fails_the_batchs_requests_and_is_logged_with_its_traceback(script, caplog):
    engine = Engine(TTS, 2, "Test")
    a, b = Sink(), Sink()
    engine.submit(a.request("a", frames=2))
    engine.submit(b.request("b", frames=2))
    bug = ValueError("a bug")
    script.fail[0] = bug
    run(engine)
    assert engine.width == 2 and a.ends == b.ends == [bug] and script.frames == [["a", "b"]]
    assert [(r.levelno, r.getMessage(), r.exc_info[1]) for r in caplog.records] == [
        (logging.ERROR, "Test: the batch failed", bug)]


def test_a_failed_batch_on_a_gpu_hands_its_cached_memory_back(script, monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(morph.engine.engine, "free_bytes", lambda device: 2**40)
    monkeypatch.setattr(morph.engine.engine, "batch_need", lambda tts, rows, prompts, width: 0)
    monkeypatch.setattr(morph.engine.engine, "allocated", lambda device: 0)
    cpu = Engine(TTS, 1, "Test")
    cpu.submit(Sink().request("a"))
    script.fail[0] = ValueError("a bug")
    run(cpu)
    assert emptied == []  # no CUDA call on the CPU
    gpu = Engine(types.SimpleNamespace(patch=TTS.patch, device=types.SimpleNamespace(type="cuda"), held=0), 1, "Test")
    gpu.submit(Sink().request("b"))
    script.fail[1] = ValueError("a bug")
    run(gpu)
    assert emptied == [True]


def test_a_request_cancelled_in_a_batch_that_then_fails_is_not_told(script):
    engine = Engine(TTS, 2, "Test")
    cancelled, other = Sink(), Sink()
    request = engine.submit(cancelled.request("a", frames=3))
    engine.submit(other.request("b", frames=3))
    script.fail[1] = ValueError("a bug")  # after the cancel, before its row left the batch
    run(engine, lambda: engine.cancel(request) if len(script.frames) == 1 else None)
    assert cancelled.ends == [] and isinstance(other.ends[0], ValueError)


def test_an_on_end_that_raises_is_logged_and_the_engine_goes_on(script, caplog):
    engine = Engine(TTS, 1, "Test")
    sink = Sink()
    request = sink.request("a", frames=1)
    request.id = 7
    request.on_end = lambda error: 1 / 0
    engine.submit(request)
    engine.submit(sink.request("b", frames=1))
    run(engine)
    assert sink.rows == ["a", "b"] and sink.ends == [None]
    assert [(r.getMessage(), r.exc_info[0]) for r in caplog.records] == [
        ("Test: request 7: on_end failed", ZeroDivisionError)]


def test_abort_ends_waiting_and_running_requests_with_its_error_or_with_held_false_the_waiting_only(script):
    stop = RuntimeError("shutting down")
    for held in (True, False):
        script.frames.clear()
        engine = Engine(TTS, 1, "Test")
        running, waiting = Sink(), Sink()
        r = engine.submit(running.request("a", frames=3))
        w = engine.submit(waiting.request("b", frames=1))
        abort = (lambda: engine.abort(stop)) if held else (lambda: engine.abort(stop, held=False))  # held: the default
        run(engine, lambda: abort() if len(script.frames) == 1 else None)
        assert waiting.ends == [stop] and w.status == "failed" and waiting.rows == []
        if held:  # a's row leaves the batch at the next frame, and hands nothing
            assert running.ends == [stop] and r.status == "failed" and running.rows == []
            assert script.frames == [["a"], ["a"]]
        else:
            assert running.ends == [None] and r.status == "done" and script.frames == [["a"]] * 3


def test_an_overcommitted_pool_is_sized_from_each_rows_prompt_and_frame_limit_to_the_slot(script):
    """Prompts at a page's edge (32 slots): a slot more or less for each row's prompt would change the pool's size."""
    engine = Engine(TTS, 2, "Test", overcommit=True)
    sink = Sink()
    engine.submit(sink.request("ab", frames=4, prompt=28))
    run(engine)
    engine.submit(sink.request("cd", frames=4, prompt=62))
    run(engine)
    assert [pages for _, _, _, pages, _ in script.builds] == [requeue_pool_pages([(28, 4)] * 2, 2),
                                                              requeue_pool_pages([(62, 4)] * 2, 2)]
    assert sink.rows == ["a", "b", "c", "d"]


def test_step_runs_one_frame_and_a_release_mid_run_closes_the_runner_and_drops_it(script):
    """The loop a frame at a time (MorphTTS.stream's reader drives it): a step runs one frame and none runs while its
    caller holds it; released between two frames, the runner is closed there and dropped, and the next run builds a
    batch again."""
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    engine.submit(sink.request("ab", frames=3))
    assert engine.step() and script.frames == [["a", "b"]] and sink.rows == []
    assert engine.step() and len(script.frames) == 2
    engine.release()
    assert len(script.frames) == 2 and script.ends == ["closed"] and sink.ends == []
    engine.release()  # twice: nothing more
    assert script.ends == ["closed"]
    engine.submit(sink.request("c", frames=1))
    run(engine)
    assert script.frames[2:] == [["c"]] and len(script.builds) == 2 and script.ends[1:] == ["idle"]
    assert sink.rows == ["c"] and sink.ends == [None]
    assert not engine.step()
    engine.release()  # after a run that ended: the runner closed itself, nothing more
    assert script.ends[1:] == ["idle"]


def test_a_render_batch_on_a_gpu_is_built_as_wide_as_its_free_memory_holds_and_a_servers_is_not_narrowed(
        script, monkeypatch, caplog):
    asked = []

    def need(tts, rows, prompts, width):  # half a GiB a row at every width, for these rows and prompts
        asked.append((tts, [r.text for r in rows], prompts, width))
        return width * 2**29

    monkeypatch.setattr(morph.engine.engine, "batch_need", need)
    monkeypatch.setattr(morph.engine.engine, "free_bytes",
                        lambda device: 3 * 2**30 if device.type == "cuda" else None)
    monkeypatch.setattr(morph.engine.engine, "allocated", lambda device: 0)  # nothing kept: held stays as given
    gpu = types.SimpleNamespace(patch=TTS.patch, device=types.SimpleNamespace(type="cuda"), held=0)
    engine = Engine(gpu, 64, "Test")
    sink = Sink()
    engine.submit(sink.request("abc", prompt=7))
    run(engine)
    assert [width for _, width, *_ in script.builds] == [4] and engine.width == 4  # 64, 32, 16, 8, then 4 fits
    assert engine.backoffs == 0  # no out-of-memory retry: a render says nothing more
    assert asked[0] == (gpu, ["a", "b", "c"], [7, 7, 7], 64) and [w for *_, w in asked] == [64, 32, 16, 8, 4]
    assert sink.ends == [None] and [r.getMessage() for r in caplog.records] == [
        "Test: 3.00 GiB of GPU memory is free, enough for a batch of 4 rows, not 64; rendering 4 at a time"]
    fits = Engine(gpu, 6, "Test")  # 3 GiB: built as asked, and nothing logged
    fits.submit(Sink().request("d"))
    run(fits)
    cpu = Engine(TTS, 64, "Test")  # no free-memory reading off a GPU
    cpu.submit(Sink().request("e"))
    run(cpu)
    live = Engine(gpu, 64, "Test", need=(64, 32))  # a server's batch: sized by its cache options
    live.submit(Sink().request("f"))
    run(live)
    assert [width for _, width, *_ in script.builds] == [4, 6, 64, 64] and len(asked) == 6
    assert len(caplog.records) == 1
    # what the engine keeps (MorphTTS.held) counts as its own: 3 GiB free and 2 held hold 8
    kept = Engine(types.SimpleNamespace(patch=TTS.patch, device=gpu.device, held=2 * 2**30), 64, "Test")
    kept.submit(Sink().request("g"))
    run(kept)
    assert script.builds[-1][1] == 8 and kept.width == 8


def test_what_a_render_leaves_allocated_is_held_and_the_next_render_is_sized_as_the_first(script, monkeypatch):
    """A render's batch state stays on the device for the next render to reuse (the kept state): measured when the
    engine is released, it counts as free when the next batch is sized, so the second render is as wide as the
    first; a render that keeps nothing more leaves it as it was."""
    allocated = [5 * 2**30]  # the weights
    gpu = types.SimpleNamespace(patch=TTS.patch, device=types.SimpleNamespace(type="cuda"), held=0)
    monkeypatch.setattr(morph.engine.engine, "allocated", lambda device: allocated[0] if device is gpu.device else None)
    monkeypatch.setattr(morph.engine.engine, "batch_need", lambda tts, rows, prompts, width: width * 2**29)
    monkeypatch.setattr(morph.engine.engine, "free_bytes", lambda device: 8 * 2**30 - allocated[0])  # an 8 GiB card
    script.after_take = lambda: allocated.__setitem__(0, 7 * 2**30)  # its first frame builds 2 GiB of state
    engine = None
    for render in range(3):
        engine = engine if render == 2 else Engine(gpu, 64, "Test")  # the last on an engine released before
        engine.submit(Sink().request("abc"))
        try:
            run(engine)
        finally:
            engine.release()
        assert gpu.held == 2 * 2**30, render
    assert [width for _, width, *_ in script.builds] == [4, 4, 4]  # 3 GiB: 4 rows of half a GiB, every time


def test_each_out_of_memory_back_off_is_counted(script):
    engine = Engine(TTS, 4, "Test")
    sink = Sink()
    engine.submit(sink.request("abcd", frames=1))
    script.fail[0] = OOM
    script.fail[1] = OOM
    run(engine)
    assert engine.width == 1 and engine.backoffs == 2 and sink.ends == [None]


def test_a_batch_out_of_memory_on_a_gpu_drops_the_kept_state_before_it_is_built_narrower(script, monkeypatch):
    """The narrower batch must not be built over the wider kept state it failed in (TalkerState.matches serves any
    narrower batch from it), and what ready() kept is no longer the engine's."""
    dropped, allocated = [], [3 * 2**30]  # the weights and the 2 GiB ready() kept
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(morph.engine.engine, "free_bytes", lambda device: None)
    loop = types.SimpleNamespace(drop_state=lambda: dropped.append(True) or allocated.__setitem__(0, 2**30))
    tts = types.SimpleNamespace(patch=types.SimpleNamespace(resolved_mode=TTS.patch.resolved_mode, loop=loop),
                                device=types.SimpleNamespace(type="cuda"), held=2 * 2**30)
    monkeypatch.setattr(morph.engine.engine, "allocated", lambda device: allocated[0] if device is tts.device else None)
    engine = Engine(tts, 2, "Test")
    sink = Sink()
    engine.submit(sink.request("ab", frames=1))
    script.fail[0] = OOM
    script.after_take = lambda: allocated.__setitem__(0, max(allocated[0], 2**30 + 2**29))  # the narrower state
    run(engine)
    assert dropped == [True] and tts.held == 0 and engine.width == 1 and sink.ends == [None]
    script.fail[1] = ValueError("a bug")  # another failure keeps the state
    engine.submit(Sink().request("c", frames=1))
    run(engine)
    assert dropped == [True]
    engine.release()  # what it keeps now is the narrower batch's state, counted from the drop
    assert tts.held == 2**29
