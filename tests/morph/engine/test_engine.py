"""morph/engine/engine.py's policy without a model: a scripted runner stands in for the batch (each row runs for its
limit in frames, `width` at a time, in the order the engine hands them out). Requests run in the order submitted and
end once every row is in; a row with other settings, or one needing more cache than the batch holds, waits for a
batch built for it; a cancel drops a request's waiting rows and ends its running ones; out of memory halves the
width and runs again the rows that handed nothing, fails a request whose audio had begun, and names the row that does
not fit alone; other errors fail the requests in the batch and the engine goes on; a caller's exception and a lost
CUDA context propagate; a preempted row runs first again. (Real batches: tests/morph/test_live_engine.py and the
golden codes.)"""

from __future__ import annotations

import types

import pytest
import torch

import morph.engine.engine
from morph.engine.engine import Engine
from morph.engine.request import Request
from morph.lines.line import Row
from morph.settings import GenerationSettings

OOM = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class Script:
    """What the scripted runners did: each build's (width, need, pages, overcommit), every frame's live rows, how each
    run of a runner ended (`ends`), and a fault to raise at a frame (`fail`: frame number -> exception)."""

    def __init__(self):
        self.builds, self.frames, self.ends, self.fail, self.preempt = [], [], [], {}, {}


def scripted(script: Script):
    class Runner:
        def __init__(self, tts, settings, width, need, stop, on_row, audio, on_chunk, pages, overcommit):
            script.builds.append((settings.temperature, width, need, pages, overcommit))
            self.width, self.stop, self.on_row, self.on_chunk = width, stop, on_row, on_chunk
            self.live: dict[Row, int] = {}  # row -> frames left
            self.batch = types.SimpleNamespace(live={}, position=0)

        def cancel(self, rows):
            for row in rows:
                if row in self.live:
                    self.live[row] = 0

        def steps(self, take, on_frames, put_back, ahead):
            try:
                yield from self._frames(take, on_frames, put_back)
            except BaseException as e:
                script.ends.append(type(e).__name__)
                raise
            script.ends.append("idle")

        def _frames(self, take, on_frames, put_back):
            while True:
                for row, _ in take(self.width - len(self.live)):
                    self.live[row] = self.stop(row)
                if not self.live:
                    return
                on_frames(len(self.live))
                frame = len(script.frames)
                script.frames.append(sorted(r.text for r in self.live))
                if frame in script.fail:
                    raise script.fail.pop(frame)
                if frame in script.preempt:
                    text = script.preempt.pop(frame)
                    row = next(r for r in self.live if r.text == text)
                    del self.live[row]
                    put_back((row, 0))
                for row in list(self.live):
                    if self.on_chunk is not None:
                        self.on_chunk(row, f"chunk of {row.text}")
                    self.live[row] -= 1
                    if self.live[row] <= 0:
                        del self.live[row]
                        self.on_row(row, f"audio of {row.text}")
                yield

    return Runner


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

    def request(self, texts, frames=2, prompt=10, temperature=0.9, stream=False):
        rows = [Row(i, 0, t, None, f"Test (line {t})", frames) for i, t in enumerate(texts)]
        return Request(rows, list(range(len(rows))), [prompt] * len(rows),
                       GenerationSettings(temperature=temperature), lambda r, a: self.rows.append(r.text),
                       self.ends.append, (lambda r, w: self.chunks.append(r.text)) if stream else None,
                       lambda rows: self.restartable)


def test_requests_run_in_order_and_each_ends_once_when_its_rows_are_in(script):
    engine = Engine(TTS, 2, "Test")
    a, b = Sink(), Sink()
    first, second = engine.submit(a.request("ab", frames=1)), engine.submit(b.request("cd", frames=1))
    engine.run_until_idle()
    assert script.frames == [["a", "b"], ["c", "d"]]
    assert a.rows == ["a", "b"] and b.rows == ["c", "d"] and a.ends == b.ends == [None]
    assert first.status == second.status == "done" and len(script.builds) == 1


def test_a_request_with_other_settings_waits_for_a_batch_of_its_own(script):
    engine = Engine(TTS, 4, "Test")
    a, b, c = Sink(), Sink(), Sink()
    engine.submit(a.request("a", frames=3))
    engine.submit(b.request("b", frames=1, temperature=0.5))
    engine.submit(c.request("c", frames=1))
    engine.run_until_idle()
    assert script.frames == [["a"]] * 3 + [["b"], ["c"]]  # c, though it samples as a does, comes after b
    assert [t for t, *_ in script.builds] == [0.9, 0.5, 0.9]


def test_a_render_batch_is_sized_to_its_rows_and_built_again_for_a_larger_one(script):
    engine = Engine(TTS, 2, "Test", overcommit=True)
    sink = Sink()
    engine.submit(sink.request("ab", frames=4, prompt=20))  # 20 + 4 + 1 slots a row
    engine.run_until_idle()
    engine.submit(sink.request("c", frames=4, prompt=10))  # smaller: the batch holds it as built
    engine.submit(sink.request("d", frames=4, prompt=30))  # larger: a batch built for it
    engine.run_until_idle()
    assert [(need, over) for _, _, need, _, over in script.builds] == [(25, True), (35, True)]
    assert script.frames[4:] == [["c"]] * 4 + [["d"]] * 4  # d joins only after c's batch drained
    live = Engine(TTS, 2, "Test", need=64)  # a server's: every row up to need, dense
    live.submit(sink.request("e"))
    live.run_until_idle()
    assert script.builds[-1][2:4] == (64, None)


def test_a_cancel_drops_waiting_rows_ends_running_ones_and_tells_nobody(script):
    engine = Engine(TTS, 1, "Test")
    a, b = Sink(), Sink()
    running = engine.submit(a.request("xy", frames=3))

    def cancel_at_first_frame(live):
        if len(script.frames) == 0:
            engine.cancel(running)

    engine.submit(b.request("z", frames=1))
    engine.run_until_idle(cancel_at_first_frame)
    assert running.status == "cancelled" and a.ends == [] and a.rows == []
    assert script.frames == [["x"], ["x"], ["z"]]  # x ended at the frame the engine saw the cancel, y never ran
    assert b.ends == [None]


def test_out_of_memory_halves_the_width_and_runs_again_the_rows_that_handed_nothing(script, caplog):
    engine = Engine(TTS, 4, "Test")
    quiet, streamed = Sink(), Sink(restart=False)
    engine.submit(quiet.request("ab", frames=2))
    engine.submit(streamed.request("c", frames=2, stream=True))
    script.fail[0] = OOM
    engine.run_until_idle()
    assert engine.width == 2 and "retrying in batches of 2" in caplog.text
    assert script.frames == [["a", "b", "c"], ["a", "b"], ["a", "b"]]  # c's chunk was out: it fails
    assert quiet.ends == [None] and sorted(quiet.rows) == ["a", "b"]
    assert "after this request's audio had begun" in str(streamed.ends[0])


def test_out_of_memory_with_one_row_names_it(script):
    engine = Engine(TTS, 1, "Test")
    sink = Sink()
    request = engine.submit(sink.request("a", frames=2))
    script.fail[0] = OOM
    engine.run_until_idle()
    assert request.status == "failed"
    assert str(sink.ends[0]).startswith("Test (line a): the GPU ran out of memory rendering a single row (1 "
                                        "characters, up to 2 frames): OutOfMemoryError: CUDA out of memory")


def test_another_error_fails_the_batchs_requests_and_the_engine_goes_on(script):
    engine = Engine(TTS, 1, "Test")
    a, b = Sink(), Sink()
    engine.submit(a.request("a", frames=2))
    engine.submit(b.request("b", frames=1))
    script.fail[0] = ValueError("a bug")
    engine.run_until_idle()
    assert isinstance(a.ends[0], ValueError) and b.ends == [None] and engine.width == 1


def test_a_lost_cuda_context_and_the_callers_exception_propagate(script):
    engine = Engine(TTS, 1, "Test")
    engine.submit(Sink().request("a"))
    script.fail[0] = RuntimeError("CUDA error: device-side assert triggered")
    with pytest.raises(RuntimeError, match="device-side assert"):
        engine.run_until_idle()

    class Stop(Exception):
        pass

    def stop(live):
        raise Stop()

    engine.submit(Sink().request("b"))
    with pytest.raises(Stop):
        engine.run_until_idle(stop)


def test_a_preempted_row_runs_first_again(script):
    engine = Engine(TTS, 2, "Test", overcommit=True)
    sink = Sink()
    engine.submit(sink.request("abc", frames=2))
    script.preempt[0] = "b"
    engine.run_until_idle()
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
    engine.run_until_idle()
    assert isinstance(bad.ends[0], ZeroDivisionError) and good.ends == [None]


def test_steps_yields_after_every_frame_and_a_close_drops_the_batch(script):
    """The loop a frame at a time (MorphTTS.stream's reader drives it): it yields after each frame and runs none
    while its driver holds it; closed between two frames, the runner is closed there and dropped, and the next run
    builds a batch again."""
    engine = Engine(TTS, 2, "Test")
    sink = Sink()
    engine.submit(sink.request("ab", frames=3))
    steps = engine.steps()
    next(steps)
    assert script.frames == [["a", "b"]] and sink.rows == []
    next(steps)
    assert len(script.frames) == 2
    steps.close()
    assert len(script.frames) == 2 and script.ends == ["GeneratorExit"] and sink.ends == []
    engine.submit(sink.request("c", frames=1))
    engine.run_until_idle()
    assert script.frames[2:] == [["c"]] and len(script.builds) == 2 and script.ends[1:] == ["idle"]
    assert sink.rows == ["c"] and sink.ends == [None]
