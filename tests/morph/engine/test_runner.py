"""The continuous batch on the tiny model (CPU, fp32, mode "lean"): rows join as others end, give each line's
single-line codes, draw from their own random streams, and their audio comes from the codec worker. A render's next
group built on a worker thread while the batch runs (GroupAhead): groups come in take's order, each built before it is
asked for; rows put back after the last group are still taken; a failure in the build reaches the caller; no worker
outlives its render, finished or stopped; and a render's rows get the codes they get with every group built on the
calling thread."""

from __future__ import annotations

import collections
import dataclasses
import threading
import types

import numpy as np
import pytest
import torch

from morph.codec.calls import FIRST_GRID, LAST_CHUNK, LIVE_CHUNK
from morph.api import MorphTTS
from morph.engine import runner as continuous
from morph.engine.runner import GroupAhead, LiveChunks
from morph.settings import runs_lean
from morph.engine.scheduler import Live
from morph.lines.reference_audio import MAX_SECONDS, MAX_TRANSCRIPT_CHARS_PER_SECOND
from morph.lines.text_split import MAX_SEGMENT_CHARS
from morph.prompts import token_count
from morph.render import BatchTTS, Line
from morph.settings import FRAMES_PER_SECOND, GenerationSettings, Sampling
from tests.audio_compare import assert_audio_close
from tests.morph.helpers import runner_codes


def settings(frames=8, sampled=False, seed=None, seq_groups=5):
    return GenerationSettings(seq_groups=seq_groups, do_sample=sampled, subtalker=Sampling(do_sample=sampled),
                              max_new_tokens=frames, seed=seed)


@pytest.fixture(scope="module")
def script(voices):
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    return [Line(" ".join(words[:1 + i % 12]) + ".", voices["icl" if i % 3 == 0 else "xvec"], "English")
            for i in range(20)]


@pytest.fixture
def lean(lean):
    """The batch front end on tests/morph/conftest.py's lean model."""
    return BatchTTS(lean)


class Ends:
    """Each row ends at its own frame, unrelated to its limit (as speech ends at EOS): BatchTTS.stop."""

    def __init__(self, tts, frames: dict[str, int]):
        self.batch, self.frames = BatchTTS(tts), frames
        self.batch.stop = lambda row: min(row.limit, self.frames[row.text])


def test_rows_join_as_others_end_and_give_each_lines_codes(tiny_tts, lean, script, dense_cache, monkeypatch):
    """40 lines through 3 slots, each ending at its own frame; with the (dense) state's capacity cut to about one
    row's need, the shared position reaches it again and again, so live rows are moved down on the way; every row's
    codes are the line's codes in eager mode alone."""
    import morph.decode.talker_loop
    from morph.engine.batch import ContinuousBatch

    monkeypatch.setattr(morph.decode.talker_loop, "capacity_for", lambda needed: needed // 2 + 8)
    moves, move_down = [], ContinuousBatch._move_down

    def spy(self, *args):
        before, live = self.position, len(self.live)
        fits = move_down(self, *args)
        moves.append((live, before - self.position))
        return fits

    monkeypatch.setattr(ContinuousBatch, "_move_down", spy)
    ends = {line.text: 5 + (7 * i) % 23 for i, line in enumerate(script)}
    got = Ends(tiny_tts, ends).batch.codes(script * 2, settings(frames=30), batch_size=3)
    run = dict(tiny_tts.patch.last_run)
    assert run["mode"] == "lean" and run["rows"] == 40 and run["width"] == 3
    assert sum(1 for live, shift in moves if live and shift > 0) >= 1  # running rows were moved down
    tiny_tts.patch.mode = "eager"
    alone = Ends(tiny_tts, ends).batch
    for line, codes in zip(script * 2, got, strict=True):
        assert codes.shape[0] == ends[line.text]
        assert torch.equal(codes, alone.codes([line], settings(frames=30))[0]), line.text


def test_a_seeded_line_draws_the_same_take_anywhere(lean, script):
    """Its own random stream: the same codes alone, in a batch at another position, after a 'resume' of the
    rest of a script; another seed gives another take."""
    s = settings(frames=10, sampled=True, seed=7)
    together = lean.codes(script[:6], s, batch_size=4)
    for i in (0, 3, 5):
        assert torch.equal(lean.codes([script[i]], s)[0], together[i]), i
    alone = lean.codes(script[3:6], s, batch_size=2)
    assert all(torch.equal(a, b) for a, b in zip(alone, together[3:], strict=True))
    other = lean.codes(script[:6], settings(frames=10, sampled=True, seed=8), batch_size=4)
    assert not any(torch.equal(a, b) for a, b in zip(other, together, strict=True))


def test_static_batches_keep_upstreams_one_stream(tiny_tts, script):
    """Static batches (eager mode's) draw from torch's generator: a row's take depends on its companions."""
    batch = BatchTTS(tiny_tts)
    assert not runs_lean(tiny_tts)
    s = settings(frames=10, sampled=True, seed=7)
    alone = batch.codes([script[1]], s)[0]
    assert not torch.equal(batch.codes([script[0], script[1]], s)[1], alone)


def test_render_decodes_each_row_as_the_codec_would(lean, script):
    """The codec stream's audio of every line is its codes' decode, in the order given, whatever the batch."""
    s = settings(frames=9)
    audio = lean.render(script[:7], s, batch_size=3)
    codes = lean.codes(script[:7], s, batch_size=3)
    decoded = lean.decode(codes, [line.voice for line in script[:7]])
    for got, want in zip(audio, decoded, strict=True):
        assert got.dtype == np.float32
        assert_audio_close(got, want, rel=1e-5)


def test_a_cancel_keeps_the_lines_already_rendered(lean, script):
    """on_step raising stops the render; every line that had ended was decoded and handed over first."""
    got, frames = {}, []

    def on_step(done, total):
        frames.append(done)
        if len(frames) == 20:
            raise InterruptedError("cancelled")

    with pytest.raises(InterruptedError):
        lean.render(script, settings(frames=6), batch_size=2, on_step=on_step,
                    on_line=lambda i, wav: got.__setitem__(i, wav))
    assert 2 <= len(got) < len(script) and all(wav.size for wav in got.values())


def test_a_batch_that_fails_mid_run_hands_over_the_lines_that_had_ended_and_leaves_no_worker(lean, script,
                                                                                              monkeypatch):
    """An error in a frame's step (not out of memory): the render raises it, after the lines that had ended were
    decoded and handed over, and the worker building prompts ahead is stopped."""
    from morph.engine.batch import ContinuousBatch

    got, steps, step = {}, [], ContinuousBatch._step

    def failing(self, finished):
        steps.append(self.position)
        if len(steps) == 20:
            raise ValueError("a bug")
        return step(self, finished)

    monkeypatch.setattr(ContinuousBatch, "_step", failing)
    with pytest.raises(ValueError, match="a bug"):
        lean.render(script, settings(frames=6), batch_size=2, on_line=lambda i, wav: got.__setitem__(i, wav))
    assert 2 <= len(got) < len(script) and all(wav.size for wav in got.values())
    assert not workers()


def test_a_codec_failure_is_raised_in_the_caller(tiny_tts, lean, script, monkeypatch):
    def broken(codes, state):
        raise ValueError("codec broke")

    monkeypatch.setattr(tiny_tts.codec, "decode", broken)
    with pytest.raises(ValueError, match="codec broke"):
        lean.render(script[:3], settings(frames=5), batch_size=2)


@pytest.fixture
def dense_cache(monkeypatch):
    """The continuous batch's keys and values dense, each row the whole capacity (the live engine's default), so
    that a test may cut the capacity to any number of slots (a paged one is a whole number of pages; the paged
    cache's moves are tests/morph/test_paged_batch.py's)."""
    import morph.engine.engine

    monkeypatch.setattr(morph.engine.engine, "pool_pages", lambda slots, width: None)
    monkeypatch.setattr(morph.engine.engine, "requeue_pool_pages", lambda rows, width: None)


class Moves(list):
    """The moves made, and the state they were made in."""
    state = None


@pytest.fixture
def moves(monkeypatch):
    """Every row move the continuous batch makes, as (from slots, to slots)."""
    from morph.decode.talker_state import TalkerState

    made, copy_rows = Moves(), TalkerState.copy_rows

    def spy(self, src, dst, kv_slots):
        made.append((src.tolist(), dst.tolist()))
        made.state = self
        copy_rows(self, src, dst, kv_slots)

    monkeypatch.setattr(TalkerState, "copy_rows", spy)
    return made


def test_the_step_narrows_to_the_live_rows_and_each_keeps_its_lines_codes(tiny_tts, lean, voices, moves):
    """Eight rows through eight slots, ICL and x-vector prompts (left-padded apart), longest text first into the
    lowest slot: the rows of the shortest texts run longest, so they sit in the highest slots and must be moved
    down as the others end, their texts not yet all read. The step runs at widths 8, 4, 2 and 1 in turn, and
    every row's codes are the line's codes in eager mode alone."""
    words = ("one two three four five six seven eight nine ten eleven twelve " * 2).split()
    lines = [Line(" ".join(words[:12 + i]) + ".", voices["icl" if i % 3 == 0 else "xvec"], "English")
             for i in range(8)]  # texts of 12..19 words: slot 7 - i holds line i
    ends = {line.text: frames for line, frames in zip(lines, [20, 15, 10, 4, 3, 6, 3, 5], strict=True)}
    # below 1 the penalty favours the tokens a row has drawn, so they steer its every pick (its `seen` matters)
    s = dataclasses.replace(settings(frames=25), repetition_penalty=0.2)
    got = Ends(tiny_tts, ends).batch.codes(lines, s, batch_size=8)
    # 8 rows for 5 frames, 4 (lines 0, 1, 2, 5) for 5, then 2 for 5 and line 0 alone for its last 5
    assert tiny_tts.patch.last_run["widths"] == {1: 5, 2: 5, 4: 5, 8: 5}, tiny_tts.patch.last_run
    # four rows left (slots 2, 5, 6, 7): lines 2, 1 and 0 into the free slots below 4, lowest first; two left
    # (lines 1 and 0, slots 1 and 3): line 0 again, to slot 0
    assert moves == [([5, 6, 7], [0, 1, 3]), ([3], [0])], moves
    tiny_tts.patch.mode = "eager"
    alone = Ends(tiny_tts, ends).batch
    for line, codes in zip(lines, got, strict=True):
        assert codes.shape[0] == ends[line.text]
        assert torch.equal(codes, alone.codes([line], s)[0]), line.text


def test_a_seeded_row_draws_its_take_wherever_it_is_moved(tiny_tts, lean, script, moves):
    """Seeded rows through four slots: line 1 joins in the second group (slot 3), and when it and line 0 are left
    it moves into the slot of line 7, of the first group; its own stream goes with it (its key and the frame it
    started at), so every row's codes are the line's codes alone."""
    lines = script[:8]
    ends = {line.text: frames for line, frames in zip(lines, [15, 20, 4, 2, 3, 3, 3, 12], strict=True)}
    batch = Ends(tiny_tts, ends).batch
    s = settings(frames=25, sampled=True, seed=11)
    got = batch.codes(lines, s, batch_size=4)
    assert moves == [([3], [0])] and tiny_tts.patch.last_run["widths"][1] > 0, (moves, tiny_tts.patch.last_run)
    for line, codes in zip(lines, got, strict=True):
        assert codes.shape[0] == ends[line.text]
        assert torch.equal(codes, batch.codes([line], s)[0]), line.text


def test_rows_that_join_after_the_step_narrowed_widen_it_again(tiny_tts, lean, voices, moves, dense_cache,
                                                               monkeypatch):
    """Four slots, rows in three groups (x-vector prompts, 10 tokens), the dense cache (the live engine's) cut to 54
    slots: the second group joins as the first one's short rows end; the third (line 0, 38 frames) does not fit
    behind the shared position until line 7 (slot 0, whose first slot bounds a move down) has ended. Meanwhile only
    lines 7 and 1 (slots 0 and 3) are left, so line 1 moves to slot 1; line 0 then joins beside it, the step widens
    to 2 again, and every row's codes are the line's codes in eager mode alone."""
    import morph.decode.talker_loop
    from morph.engine.batch import ContinuousBatch

    words = "one two three four five six seven eight".split()
    lines = [Line(" ".join(words[:1 + i]) + ".", voices["xvec"], "English") for i in range(8)]
    ends = {line.text: frames for line, frames in zip(lines, [38, 40, 3, 3, 3, 3, 3, 7], strict=True)}
    joins, join = [], ContinuousBatch._join

    def spy(self, *args):
        joined = join(self, *args)
        joins.append((joined, len(moves), sorted(self.live)))
        return joined

    monkeypatch.setattr(ContinuousBatch, "_join", spy)
    with monkeypatch.context() as cut:
        cut.setattr(morph.decode.talker_loop, "capacity_for", lambda needed: 54)
        got = Ends(tiny_tts, ends).batch.codes(lines, settings(frames=60), batch_size=4)
    assert moves == [([3], [1])], moves
    # the slot line 1 left is free, not a live row a wider step would step (with its old bound: 0 / 0 in the fused
    # attention once the position restarted, and a pick past the vocabulary, the device-side assert under load)
    assert not moves.state.unfinished.any(), moves.state.unfinished
    assert (False, 0, [0, 3]) in joins and joins[-1] == (True, 1, [0, 1]), joins  # line 0 joined after the move
    assert tiny_tts.patch.last_run["widths"][2] > 30, tiny_tts.patch.last_run
    tiny_tts.patch.mode = "eager"
    alone = Ends(tiny_tts, ends).batch
    for line, codes in zip(lines, got, strict=True):
        assert codes.shape[0] == ends[line.text]
        assert torch.equal(codes, alone.codes([line], settings(frames=60))[0]), line.text


def test_rows_that_run_to_their_limit_leave_room_for_the_hosts_lag(tiny_tts, lean, script, dense_cache, monkeypatch):
    """On a GPU the host learns that a row ended `lag` frames late, and the step writes the shared position for
    every slot until then: a row joins only where its frames, its EOS slot and those frames fit in the capacity
    (here cut to one row's need plus the lag, on the CPU with a GPU's lag of 4), so no step writes past it. Before,
    rows that ran to their limit stepped past the capacity (an index out of bounds; ComfyUI's Render Lines on an
    H100)."""
    import morph.decode.talker_loop
    from morph.engine.batch import ContinuousBatch

    monkeypatch.setattr(morph.decode.talker_loop, "capacity_for", lambda needed: needed // 2 + 4)
    build = ContinuousBatch.__init__

    def with_a_gpus_lag(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.lag = 4
        self._flags = torch.ones(self.lag + 2, self.st.batch, dtype=torch.bool)  # the ring the host reads them in

    monkeypatch.setattr(ContinuousBatch, "__init__", with_a_gpus_lag)
    lines = script[:5]
    ends = {line.text: 30 for line in lines}  # every row runs to its limit
    got = Ends(tiny_tts, ends).batch.codes(lines, settings(frames=30), batch_size=2)
    assert [c.shape[0] for c in got] == [30] * 5


def test_a_render_leaves_nothing_that_holds_its_state_once_released(tiny_tts, lean, script):
    """release_device_state frees the continuous batch's state (its key/value pool) at once, by reference counting
    alone: nothing the render made holds it in a cycle that waits for the garbage collector (on an H100 a render at
    batch 32 after one at 64 measured the first one's pool too, bench/results/h100-2026-11-25d/NOTES.md)."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        lean.render(script[:3], settings(frames=5), batch_size=2)
        state = weakref.ref(tiny_tts.patch.loop._state)
        tiny_tts.release_device_state()
        assert state() is None
    finally:
        gc.enable()


def test_only_the_static_loop_keeps_each_slots_hidden_state(tiny_tts, lean, script, dense_cache):
    """The continuous batch reads no step's hidden state, so its state keeps none (0.5 GiB at batch 64 of the 0.6B,
    bench/results/h200-2026-11-26d/NOTES.md); eager's static render of the same width after it gets a state that
    keeps them, which it hands back as upstream's generate does, rather than the continuous batch's."""
    lean.render(script[:3], settings(frames=5), batch_size=3)
    assert tiny_tts.patch.loop._state.hidden is None
    tiny_tts.patch.mode = "eager"
    static = lean.render(script[:3], settings(frames=5), batch_size=3)
    st = tiny_tts.patch.loop._state
    assert st.hidden is not None and st.hidden.shape[:2] == (3, st.capacity) and len(static) == 3


class _Row:
    """A row as LiveChunks reads it: a name, and a line with no ICL voice."""

    def __init__(self, name):
        self.name, self.line = name, types.SimpleNamespace(voice=None)


class _Codec:
    """CodecStream's side LiveChunks calls, recorded: each feed's (frame it came at, size, [(row, frames)])."""

    def __init__(self):
        self.decoded, self.feeds, self.frame = {}, [], 0

    def open(self, name, ref):
        self.decoded[name] = 0

    def done(self, name):
        return self.decoded[name]

    def feed(self, names, frames, size, ended):
        self.feeds.append((self.frame, size, [(n, int(f.shape[0])) for n, f in zip(names, frames, strict=True)]))
        for n, f in zip(names, frames, strict=True):
            self.decoded[n] += int(f.shape[0])


def test_a_live_rows_chunks_ramp_up_each_as_soon_as_its_frames_are_known_the_smallest_call_first():
    """A live batch on a GPU (the host learns of EOS 4 frames behind, EOS held back for 2): row a joins at frame 0 and b
    at frame 10; each one's chunks grow from 2 frames to 16, each ending on a mark of its size, the first 2 frames
    after the row joins (no lag: EOS cannot have come), the next ones once their frames are 4 behind; at frame 12 b's
    first chunk goes before a's 4 frames, and from frame 52 their 16 frames share one call."""
    a, b = _Row("a"), _Row("b")
    batch = types.SimpleNamespace(lag=4, hold=2, live={}, st=types.SimpleNamespace(frames=torch.zeros(2, 64, 16)),
                                  sched=types.SimpleNamespace(frame=0))
    codec = _Codec()
    chunks = LiveChunks(batch, codec, ramp=True)
    assert chunks.sizes == (1, 2, 4, 8, 16, 32)
    for frame in range(60):
        if frame == 0:
            batch.live[0] = Live(a, 0, 0, 0, 50)
        if frame == 10:
            batch.live[1] = Live(b, 0, 10, 10, 50)
        codec.frame = batch.sched.frame = frame
        chunks.step()
    got = {name: [(f, n) for f, _, fed in codec.feeds for r, n in fed if r.name == name] for name in "ab"}
    assert got["a"] == [(2, 2), (8, 2), (12, 4), (20, 8), (36, 16), (52, 16)]
    assert got["b"] == [(12, 2), (18, 2), (20, 2), (24, 4), (28, 4), (36, 8), (52, 16)]
    assert [size for f, size, _ in codec.feeds if f == 12] == [2, 4]
    assert [(size, len(fed)) for f, size, fed in codec.feeds if f == 52] == [(16, 2)]


def test_a_renders_row_goes_out_four_frames_a_chunk_then_sixteen_and_its_rest_in_a_size_made_ready():
    """A render's batch on a GPU (the host learns of EOS 4 frames behind): a row that joined at frame 4 goes out 4
    frames at a time until in step with LIVE_CHUNK (its frame 12), then 16 at a time. Handed over early by a drain,
    19 frames after its last chunk, its rest goes out in one call of LAST_CHUNK frames, a size made ready with the
    others."""
    a = _Row("a")
    batch = types.SimpleNamespace(lag=4, hold=2, live={}, st=types.SimpleNamespace(frames=torch.zeros(1, 128, 16)),
                                  sched=types.SimpleNamespace(frame=0))
    codec = _Codec()
    chunks = LiveChunks(batch, codec)
    assert chunks.sizes == (FIRST_GRID, LIVE_CHUNK, LAST_CHUNK)
    for frame in range(45):
        if frame == 4:
            batch.live[0] = Live(a, 0, 4, 4, 100)
        if frame == 41:
            del batch.live[0]
            chunks.end(a, torch.zeros(47, 16))
        codec.frame = batch.sched.frame = frame
        chunks.step()
    assert [(f, size, n) for f, size, fed in codec.feeds for _, n in fed] == [
        (12, 4, 4), (16, 4, 4), (20, 4, 4), (36, 16, 16), (44, LAST_CHUNK, 19)]


@pytest.mark.parametrize("variant", ["custom_voice", "voice_design"])
def test_a_speakers_or_an_instructs_longest_line_is_a_whole_segment_as_its_short_runs_lines_are_spoken(model_dirs,
                                                                                                     variant):
    tts = MorphTTS.load(str(model_dirs("tiny", variant)), device="cpu", dtype="fp32")
    longest, warm = continuous.longest_line(tts), continuous.warm_lines(tts, 1)[0]
    assert longest.text == "0123456789" * (MAX_SEGMENT_CHARS // 10) and longest.voice is None
    assert (longest.speaker, longest.instruct) == (warm.speaker, warm.instruct) and (warm.speaker or warm.instruct)
    assert BatchTTS(tts).render([longest], GenerationSettings(seed=0, max_new_tokens=4))[0].size


CPU = torch.device("cpu")
WORKER = "morph-prompts"


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(WORKER)]


def source(items: list, width: int, build):
    pending = collections.deque(items)
    take = lambda n: [pending.popleft() for _ in range(min(n, len(pending)))]  # noqa: E731
    return GroupAhead(build, take, width, CPU), pending


def test_groups_come_in_order_each_built_on_the_worker_before_it_is_asked_for():
    built, second_built = [], threading.Event()

    def build(chunk):
        built.append((chunk, threading.current_thread().name))
        if chunk == [3, 4, 5]:
            second_built.set()
        return chunk

    ahead, _ = source(list(range(7)), 3, build)
    try:
        assert ahead.next() == [0, 1, 2]
        assert second_built.wait(10)  # built while the caller had not asked for it yet
        assert ahead.next() == [3, 4, 5] and ahead.next() == [6] and ahead.next() is None
    finally:
        ahead.close()
    assert [c for c, _ in built] == [[0, 1, 2], [3, 4, 5], [6]]
    assert all(name.startswith(WORKER) for _, name in built)
    assert not workers()


def test_rows_put_back_after_the_last_group_are_still_taken():
    ahead, pending = source([0, 1], 2, list)
    try:
        assert ahead.next() == [0, 1] and ahead.next() is None
        pending.appendleft(1)  # a preempted row, back to its source
        assert ahead.next() == [1] and ahead.next() is None
    finally:
        ahead.close()


def test_a_failed_build_reaches_the_caller_and_the_worker_stops():
    def build(chunk):
        raise ValueError(f"no prompt for {chunk}")

    ahead, _ = source([0, 1, 2], 2, build)
    with pytest.raises(ValueError, match=r"no prompt for \[0, 1\]"):
        ahead.next()
    ahead.close()
    assert not workers()


SETTINGS = GenerationSettings(seq_groups=5, do_sample=True, subtalker=Sampling(do_sample=True), seed=3,
                              max_new_tokens=48)
TEXTS = ["one two three four.", "five six.", "seven eight nine ten eleven.", "twelve.", "thirteen fourteen.",
         "fifteen sixteen seventeen.", "eighteen."]


def codes_of(tts, voice, ahead: bool) -> dict:
    lines = [Line(t, voice, "English") for t in TEXTS]
    return runner_codes(tts, SETTINGS, lines, 2, lambda row: row.limit, ahead=ahead)[0]


def test_groups_built_ahead_give_the_rows_their_codes(lean, voices, monkeypatch):
    """Seven rows two at a time: the first group's prompt is built on the calling thread, every later one on the
    worker, and every row's codes are those of the render that built them all on the calling thread."""
    inline = codes_of(lean.tts, voices["icl"], ahead=False)
    threads, row_prompts = [], continuous.row_prompts
    monkeypatch.setattr(continuous, "row_prompts", lambda *args, **kwargs: (
        threads.append(threading.current_thread().name), row_prompts(*args, **kwargs))[1])
    ahead = codes_of(lean.tts, voices["icl"], ahead=True)
    assert threads[0] == threading.current_thread().name and len(threads) == 4
    assert all(name.startswith(WORKER) for name in threads[1:])
    assert sorted(ahead) == sorted(inline) == list(range(len(TEXTS)))
    assert all(torch.equal(ahead[i], inline[i]) for i in inline)
    assert not workers()


def test_a_render_stopped_midway_leaves_no_worker(lean, voices):
    """A cancel (on_step raising, as ComfyUI's interrupt does) while a later group is built or waiting."""
    calls = []

    def on_step(done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped")

    lines = [Line(t, voices["xvec"], "English") for t in TEXTS]
    with pytest.raises(KeyboardInterrupt):
        lean.render(lines, SETTINGS, batch_size=2, on_step=on_step)
    assert not workers()


def test_the_engines_short_run_before_the_first_request_speaks_lines_the_model_takes(tiny_tts, lean):
    """MorphTTS.ready's lines pass every front end's checks and render; three in four take the long text, whose frame
    limit sizes the pool a script's lines of up to about 40 s fit; the Base model's alternate x-vector and ICL voices.
    The longest line, which sizes the state, is a whole segment a token a character, in the longest reference and
    transcript. Off CUDA nothing is captured, so ready() does nothing and says so."""
    lines = continuous.warm_lines(tiny_tts, 8)
    assert [line.text == continuous.WARM_LONG for line in lines] == [True, True, True, False] * 2
    assert [line.voice.icl for line in lines] == [False, True] * 4
    longest, count = continuous.longest_line(tiny_tts), token_count(tiny_tts)
    assert len(longest.text) == count(longest.text) == MAX_SEGMENT_CHARS
    assert longest.voice.ref_code.shape == (MAX_SECONDS * FRAMES_PER_SECOND, 16)
    assert len(longest.voice.ref_text) == count(longest.voice.ref_text) == MAX_SECONDS * MAX_TRANSCRIPT_CHARS_PER_SECOND
    assert longest.voice.model_size == tiny_tts.model_size and not longest.voice.spk_embedding.any()
    audio = BatchTTS(tiny_tts).render(lines + [longest],
                                      GenerationSettings(seed=0, max_new_tokens=continuous.WARM_FRAMES))
    assert len(audio) == 9 and all(len(a) for a in audio)
    assert tiny_tts.ready(8) is None and tiny_tts.held == 0
    ready = continuous.ready_lines(tiny_tts, 9)  # what ready(9) renders, and ComfyUI is told it needs
    assert [(line.text, line.voice.icl) for line in ready] == [(line.text, line.voice.icl) for line in lines + [longest]]
    assert len(continuous.ready_lines(tiny_tts, 1)) == 1
