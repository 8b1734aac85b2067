"""The continuous path's contract (tests/morph/golden.py): the codes it gives for fixed scripts, greedy and seeded,
one row, 8 and 64 at once and rows joining as others end, are the recorded ones; a streamed render's audio and the
live engine's requests, one of them cancelled mid-batch, are those codes' audio."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morph.engine.thread import LiveEngine
from morph.render import BatchTTS
from tests.audio_compare import assert_audio_close
from tests.morph import golden
from tests.morph.engine.test_thread import Sink


@pytest.fixture(scope="module")
def recorded():
    return golden.load()


@pytest.mark.parametrize("name", list(golden.CASES))
def test_the_codes_are_the_recorded_ones(lean, voices, recorded, name):
    got = golden.run(lean, golden.CASES[name], voices)
    want = recorded[name]
    assert len(got) == len(want)
    differ = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if not torch.equal(g, w)]
    assert not differ, f"{name}: rows {differ} differ from tests/fixtures/golden_codes.npz"


def test_a_streamed_render_is_the_recorded_codes_audio(lean, voices, recorded):
    """Streamed (its pool never overcommitted, each row's audio handed out as it is made), each line's chunks join to
    the decode of its recorded codes."""
    case = golden.CASES["seeded-joins"]
    batch, stops, lines = BatchTTS(lean), golden.ends(case), golden.lines(case, voices)
    batch.stop = lambda row: min(row.limit, stops[row.index])
    chunks: dict[int, list] = {}
    whole = batch.render(lines, case.settings(), batch_size=case.width,
                         on_chunk=lambda i, wav: chunks.setdefault(i, []).append(wav))
    want = batch.decode(recorded["seeded-joins"], [line.voice for line in lines])
    for i, (audio, expected) in enumerate(zip(whole, want, strict=True)):
        assert len(chunks[i]) > 1 or stops[i] <= 4, i  # streamed: several chunks for all but the shortest rows
        np.testing.assert_array_equal(np.concatenate(chunks[i]), audio)
        assert_audio_close(audio, expected, rel=1e-5)


def test_the_live_engines_requests_are_the_recorded_codes_audio_when_one_is_cancelled(lean, voices, recorded):
    """Eight requests through four slots of the server's engine, each ending at its limit; the third is cancelled at
    its first chunk, so a waiting one takes its slot mid-batch; the others' audio is their recorded codes'."""
    case = golden.CASES["seeded-8"]
    lines = golden.lines(case, voices)
    want = BatchTTS(lean).codes(lines, case.settings(), batch_size=8)  # every row to its limit
    assert [c.shape[0] for c in want] == [golden.FRAMES] * 8
    engine = LiveEngine(lean, width=4, max_frames=64, max_prompt=400)
    try:
        sinks, requests = [], []
        for i, line in enumerate(lines):
            sink = Sink(on_first=(lambda: engine.cancel(requests[2])) if i == 2 else None)
            sinks.append(sink)
            requests.append(engine.submit(line, case.settings(), sink.chunk, sink.end))
        audio = {i: sink.audio() for i, sink in enumerate(sinks) if i != 2}
    finally:
        engine.close()
    decoded = BatchTTS(lean).decode(want, [line.voice for line in lines])
    assert requests[2].status == "cancelled"
    for i, got in audio.items():
        assert_audio_close(got, decoded[i], rel=1e-5)
    # the uncut rows of the recorded seeded-8 case agree with these full-length ones up to their own ends
    for i, (full, cut) in enumerate(zip(want, recorded["seeded-8"], strict=True)):
        assert torch.equal(full[:cut.shape[0]], cut), i
