"""The continuous batch on the tiny model (CPU, fp32, mode "lean"): rows join as others end, give each line's
single-line codes, draw from their own random streams, and their audio comes from the codec worker."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morph.continuous import runs_lean
from morph.scheduler import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling
from tests.audio_compare import assert_audio_close

SR = 24000


def settings(frames=8, sampled=False, seed=None, seq_groups=5):
    return GenerationSettings(seq_groups=seq_groups, do_sample=sampled, subtalker=Sampling(do_sample=sampled),
                              max_new_tokens=frames, seed=seed)


@pytest.fixture(scope="module")
def voices(tiny_tts):
    t = np.arange(2 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return {"xvec": tiny_tts.make_voice(wave, SR),
            "icl": tiny_tts.make_voice(wave, SR, transcript="A short reference sentence.")}


@pytest.fixture(scope="module")
def script(voices):
    words = "one two three four five six seven eight nine ten eleven twelve".split()
    return [Line(" ".join(words[:1 + i % 12]) + ".", voices["icl" if i % 3 == 0 else "xvec"], "English")
            for i in range(20)]


@pytest.fixture
def lean(tiny_tts):
    tiny_tts.patch.mode = "lean"
    yield BatchTTS(tiny_tts)
    tiny_tts.patch.mode = "auto"
    tiny_tts.release_device_state()


class Ends:
    """Each row ends at its own frame, unrelated to its limit (as speech ends at EOS): BatchTTS.stop."""

    def __init__(self, tts, frames: dict[str, int]):
        self.batch, self.frames = BatchTTS(tts), frames
        self.batch.stop = lambda row: min(row.limit, self.frames[row.text])


def test_rows_join_as_others_end_and_give_each_lines_codes(tiny_tts, lean, script, monkeypatch):
    """40 lines through 3 slots, each ending at its own frame; with the state's capacity cut to about one row's
    need, the shared position reaches it again and again, so live rows are moved down on the way; every row's
    codes are the line's codes in eager mode alone."""
    import morph.decode.talker_loop
    from morph.decode.slots import ContinuousBatch

    monkeypatch.setattr(morph.decode.talker_loop, "capacity_for", lambda needed: needed // 2 + 8)
    moves, move_down = [], ContinuousBatch._move_down

    def spy(self, *args):
        before, live = self.position, len(self.live)
        fits = move_down(self, *args)
        moves.append((live, before - self.position))
        return fits

    monkeypatch.setattr(ContinuousBatch, "_move_down", spy)
    ends = {line.text: 5 + (7 * i) % 23 for i, line in enumerate(script)}
    got = Ends(tiny_tts, ends).batch.codes(script * 2, settings(frames=30), batch_size=3, continuous=True)
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
    together = lean.codes(script[:6], s, batch_size=4, continuous=True)
    for i in (0, 3, 5):
        assert torch.equal(lean.codes([script[i]], s, continuous=True)[0], together[i]), i
    alone = lean.codes(script[3:6], s, batch_size=2, continuous=True)
    assert all(torch.equal(a, b) for a, b in zip(alone, together[3:], strict=True))
    other = lean.codes(script[:6], settings(frames=10, sampled=True, seed=8), batch_size=4, continuous=True)
    assert not any(torch.equal(a, b) for a, b in zip(other, together, strict=True))


def test_static_batches_keep_upstreams_one_stream(tiny_tts, script):
    """Static batches (the default) draw from torch's generator: a row's take depends on its companions; eager
    mode has no continuous batch."""
    batch = BatchTTS(tiny_tts)
    assert not runs_lean(tiny_tts)
    with pytest.raises(ValueError, match="continuous batching runs the lean layers"):
        batch.render([script[0]], settings(), continuous=True)
    s = settings(frames=10, sampled=True, seed=7)
    alone = batch.codes([script[1]], s)[0]
    assert not torch.equal(batch.codes([script[0], script[1]], s)[1], alone)


def test_render_decodes_each_row_as_the_codec_would(lean, script):
    """The codec stream's audio of every line is its codes' decode, in the order given, whatever the batch."""
    s = settings(frames=9)
    audio = lean.render(script[:7], s, batch_size=3, continuous=True)
    codes = lean.codes(script[:7], s, batch_size=3, continuous=True)
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
        lean.render(script, settings(frames=6), batch_size=2, on_step=on_step, continuous=True,
                    on_line=lambda i, wav: got.__setitem__(i, wav))
    assert 2 <= len(got) < len(script) and all(wav.size for wav in got.values())


def test_a_codec_failure_is_raised_in_the_caller(tiny_tts, lean, script, monkeypatch):
    def broken(codes, state):
        raise ValueError("codec broke")

    monkeypatch.setattr(tiny_tts.codec, "decode", broken)
    with pytest.raises(ValueError, match="codec broke"):
        lean.render(script[:3], settings(frames=5), batch_size=2, continuous=True)
