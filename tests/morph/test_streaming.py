"""Audio as it is made (tiny model, CPU, fp32, mode "lean"): the continuous batch hands each row's audio a chunk at a
time while the row runs (morph/continuous.py LiveChunks, morph/codec/stream.py CodecStream), BatchTTS.render's on_chunk
hands each line's in order (morph/line_audio.py LineChunks), and MorphTTS.stream yields one line's; the chunks
joined are the line's audio as the render without chunks decodes it. Eager mode hands the whole line as one chunk."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import morph.engine.engine
from morph.codec.calls import FIRST_GRID
from morph.engine.runner import RowRunner
from morph.line_audio import SEGMENT_PAUSE_SECONDS
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling
from tests.audio_compare import assert_audio_close

SR = 24000
FRAME = 1920  # samples a frame at 24 kHz


def settings(frames):
    return GenerationSettings(seq_groups=5, do_sample=False, subtalker=Sampling(do_sample=False),
                              max_new_tokens=frames)


def test_rows_hand_their_audio_while_they_run_and_it_joins_to_each_lines_audio(lean, voices):
    """Four rows in three slots, each ending at its own frame: line 2 is a long text in two segments (its second
    ends first, so its chunks wait for the first's end and follow it with the pause), line 1 joins when that
    segment's slot frees up, at the next FIRST_GRID mark. Each line's first chunk is its first FIRST_GRID frames, long
    before it ends, the lines' chunks come interleaved, and each line's chunks joined are what on_line gets, and the
    render without on_chunk's audio to rounding."""
    sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank today. "
    lines = [Line("one two three four five six.", voices["icl"], "English"),
             Line("seven.", voices["xvec"], "English"),
             Line(sentence * 8, voices["xvec"], "English")]
    ends = {(0, 0): 23, (1, 0): 9, (2, 0): 14, (2, 1): 6}  # (line, segment) -> its last frame
    batch = BatchTTS(lean)
    batch.stop = lambda row: min(row.limit, ends[(row.index, row.segment)])
    frames, log, lines_done = [], [], {}

    def on_chunk(i, wav):
        log.append((i, len(frames), wav))  # frames run before this chunk was handed out

    audio = batch.render(lines, settings(30), batch_size=3, on_chunk=on_chunk,
                         on_step=lambda done, total: frames.append(done),
                         on_line=lambda i, wav: lines_done.__setitem__(i, len(frames)))
    plain = batch.render(lines, settings(30), batch_size=3)

    chunks = {i: [wav for j, _, wav in log if j == i] for i in range(3)}
    first = {i: next(f for j, f, _ in log if j == i) for i in range(3)}
    for i in range(3):
        assert np.array_equal(np.concatenate(chunks[i]), audio[i]), i
        assert_audio_close(audio[i], plain[i], rel=1e-5)
    assert audio[0].size == 23 * FRAME and audio[1].size == 9 * FRAME
    assert audio[2].size == (14 + 6) * FRAME + int(SEGMENT_PAUSE_SECONDS * SR)
    # lines 0 and 2 start at frame 0; segment (2, 1) ends at frame 6, and line 1 joins at the next FIRST_GRID mark,
    # so that its chunks share the others' calls; each first chunk is FIRST_GRID frames
    assert first[0] == first[2] == FIRST_GRID and first[1] == -(-6 // FIRST_GRID) * FIRST_GRID + FIRST_GRID
    assert all(chunks[i][0].size == FIRST_GRID * FRAME for i in range(3))
    assert all(first[i] < lines_done[i] for i in range(3)) and len(chunks[0]) >= 4
    line0 = [k for k, (j, _, _) in enumerate(log) if j == 0]
    assert any(log[k][0] != 0 for k in range(line0[0], line0[-1])), "another line's chunks come between line 0's"
    # line 2: segment 0's chunks as made, then at its end the pause and segment 1's (made meanwhile) at once
    pause = next(k for k, wav in enumerate(chunks[2]) if wav.size and not wav.any())
    assert sum(w.size for w in chunks[2][:pause]) == 14 * FRAME
    at_pause = [f for j, f, _ in log if j == 2][pause:]
    assert len(set(at_pause)) == 1, "segment 1 had ended: its chunks follow the pause at once"


def test_out_of_memory_retries_a_streamed_render_only_while_no_chunk_is_out(lean, voices, caplog, monkeypatch):
    """Out of memory before any chunk is out: the rows go again in smaller batches and each line's chunks are handed
    once (joined, its audio). After a chunk is out a retry would hand it again, so the render fails and says so."""
    lines = [Line("one two three four five six.", voices["xvec"], "English"),
             Line("seven eight nine.", voices["icl"], "English")]
    batch = BatchTTS(lean)

    def render(fail_at, got):
        frames = []

        class OutOfMemoryOnce(RowRunner):  # out of memory once, before the `fail_at`th frame of the render
            def step(self, take, before_frame=None, *args, **kwargs):
                def frame(n):
                    frames.append(n)
                    if len(frames) == fail_at:
                        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                    before_frame(n)

                return super().step(take, frame, *args, **kwargs)

        monkeypatch.setattr(morph.engine.engine, "RowRunner", OutOfMemoryOnce)
        return batch.render(lines, settings(12), batch_size=2,
                            on_chunk=lambda i, wav: got.append((i, wav)))

    got = []
    with caplog.at_level("WARNING"):
        audio = render(1, got)
    assert "retrying in batches of 1" in caplog.text and "set batch_size to 1" in caplog.text
    monkeypatch.undo()
    plain = batch.render(lines, settings(12), batch_size=2)
    for i in range(2):
        assert np.array_equal(np.concatenate([wav for j, wav in got if j == i]), audio[i]), i
        assert_audio_close(audio[i], plain[i], rel=1e-5)
    got = []
    with pytest.raises(RuntimeError, match="ran out of memory .* after this request's audio had begun.*batch size"):
        render(2 * FIRST_GRID, got)
    assert got, "chunks were out before the failure"


def test_stream_yields_a_lines_audio_as_it_is_made(lean, voices):
    line = Line("Stream this line.", voices["icl"], "English")
    chunks = list(lean.stream(line.text, line.voice, "English", settings(12)))
    assert [c.size // FRAME for c in chunks] == [FIRST_GRID] * 3 and all(c.dtype == np.float32 for c in chunks)
    whole = BatchTTS(lean).render([line], settings(12), batch_size=None)[0]
    assert_audio_close(np.concatenate(chunks), whole, rel=1e-5)


def test_a_stream_runs_its_frames_on_the_readers_thread_as_it_reads(lean, voices, monkeypatch):
    """No thread of its own: each next() runs the engine's frames on the reader's thread until a chunk is ready, and
    none runs while the reader holds a chunk; the reader's code between two frames runs as its own, not in the frame
    loop's inference mode."""
    steps, threads, before = [], set(), set(threading.enumerate())
    step = lean.patch.loop.frame_step

    def counted(*args, **kwargs):
        steps.append(threading.current_thread())
        threads.update(t.name for t in threading.enumerate() if t not in before)
        return step(*args, **kwargs)

    monkeypatch.setattr(lean.patch.loop, "frame_step", counted)
    chunks = lean.stream("A line read slowly.", voices["xvec"], "English", settings(16))
    assert not steps, "nothing runs before the first chunk is asked for"
    read = []
    for chunk in chunks:
        ran = len(steps)
        assert not torch.is_inference_mode_enabled()
        time.sleep(0.2)  # a reader that takes its time: no frame is made meanwhile
        assert len(steps) == ran
        read.append((ran, chunk.size // FRAME))
    assert set(steps) == {threading.current_thread()}
    assert not {name for name in threads if not name.startswith("morph-prompts")}  # only the engine's prompt worker
    # a chunk once its frames are made (FIRST_GRID frames a chunk), and the line's last frames after the last frame
    assert [n for _, n in read] == [FIRST_GRID] * 4 and [f for f, _ in read][:3] == [FIRST_GRID + 1, 2 * FIRST_GRID + 1,
                                                                                    3 * FIRST_GRID + 1]


@pytest.mark.parametrize("how", ["close", "drop"])
def test_closing_a_stream_stops_its_render_and_frees_it(lean, voices, monkeypatch, how):
    """A 200-frame line: the reader takes its first chunk and closes the stream (or drops it): no frame runs after
    that chunk, and the engine has released its batch by the time close() returns, with no garbage collection."""
    from morph.engine.batch import ContinuousBatch

    batches, steps = [], []
    init, step = ContinuousBatch.__init__, lean.patch.loop.frame_step

    def made(self, *args, **kwargs):
        batches.append(weakref.ref(self))
        init(self, *args, **kwargs)

    monkeypatch.setattr(ContinuousBatch, "__init__", made)
    monkeypatch.setattr(lean.patch.loop, "frame_step", lambda *a, **k: steps.append(1) or step(*a, **k))
    chunks = lean.stream("A line the reader leaves early.", voices["xvec"], "English", settings(200))
    assert next(chunks).size == FIRST_GRID * FRAME
    ran = len(steps)
    assert len(batches) == 1 and batches[0]() is not None
    gc.disable()  # freed by the release, not by a collection
    try:
        if how == "close":
            chunks.close()
        else:
            del chunks
        assert batches[0]() is None
    finally:
        gc.enable()
    assert ran <= 2 * FIRST_GRID and len(steps) == ran


def test_a_streams_failure_is_raised_to_its_reader(lean, voices, monkeypatch):
    def broken(codes, state):
        raise ValueError("codec broke")

    with pytest.raises(ValueError, match="text is empty"):
        lean.stream("  ", voices["xvec"])  # checked at the call, before any chunk is asked for
    monkeypatch.setattr(lean.codec, "decode", broken)
    with pytest.raises(ValueError, match="codec broke"):
        list(lean.stream("It breaks.", voices["xvec"], "English", settings(8)))


def test_a_failure_after_the_first_chunks_comes_after_them(lean, voices, monkeypatch):
    """A frame step that fails at frame 10: the reader gets the chunks made before it, then the error, where it
    reads."""
    steps, step = [], lean.patch.loop.frame_step

    def failing(*args, **kwargs):
        steps.append(1)
        if len(steps) == 10:
            raise ValueError("step broke")
        return step(*args, **kwargs)

    monkeypatch.setattr(lean.patch.loop, "frame_step", failing)
    chunks = lean.stream("It breaks later.", voices["xvec"], "English", settings(40))
    got = [next(chunks).size // FRAME, next(chunks).size // FRAME]
    with pytest.raises(ValueError, match="step broke"):
        next(chunks)
    assert got == [FIRST_GRID, FIRST_GRID] and len(steps) == 10


def test_a_streams_chunks_joined_are_clones_audio_for_the_same_seed(lean, voices):
    """Sampled and seeded, a long text in two segments: the stream's take is clone's, its chunks joined clone's
    audio, pause included."""
    sentence = "The quick brown fox jumps over the lazy dog near the quiet river bank today. "
    s = GenerationSettings(seq_groups=5, seed=11, max_new_tokens=10)
    chunks = list(lean.stream(sentence * 8, voices["icl"], "English", s))
    clone = lean.clone(sentence * 8, voices["icl"], "English", s)
    assert len(chunks) > 2 and clone.size == 20 * FRAME + int(SEGMENT_PAUSE_SECONDS * SR)
    np.testing.assert_array_equal(np.concatenate(chunks), clone)


def test_eager_hands_the_whole_line_as_one_chunk(tiny_tts, voices):
    """Eager mode (what auto runs on the CPU) keeps upstream's static batch: stream yields clone's audio, once."""
    s = settings(10)
    chunks = list(tiny_tts.stream("The whole line.", voices["icl"], "English", s))
    clone = tiny_tts.clone("The whole line.", voices["icl"], "English", s)
    assert len(chunks) == 1 and np.array_equal(chunks[0], clone)
    got = []
    BatchTTS(tiny_tts).render([Line("The whole line.", voices["icl"], "English")], s,
                              on_chunk=lambda i, wav: got.append((i, wav)))
    assert len(got) == 1 and got[0][0] == 0 and np.array_equal(got[0][1], chunks[0])
