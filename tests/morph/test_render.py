"""The front end on the tiny model (CPU, fp32): what batch invariance holds, per-row EOS and limits,
batched codec decode, progress, cancel, out-of-memory halving, errors. Exactness against upstream
(a batch of one and a batch of several) is in test_exactness.py."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import torch

import morph.prompts as prompts_module
from morph.line_audio import SEGMENT_PAUSE_SECONDS
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling
from tests.audio_compare import assert_audio_close

from .helpers import recorded_codes

SR = 24000


def greedy(seq_groups=5, frames=8, **kw):
    return GenerationSettings(seq_groups=seq_groups, do_sample=False, subtalker=Sampling(do_sample=False),
                              max_new_tokens=frames, **kw)


@pytest.fixture(scope="module")
def voices(tiny_tts):
    rng = np.random.RandomState(0)
    t = np.arange(2 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.randn(t.size))
    wave = wave.astype(np.float32)
    return {"xvec": tiny_tts.make_voice(wave, SR),
            "icl": tiny_tts.make_voice(wave, SR, transcript="A short reference sentence.")}


@pytest.fixture(scope="module")
def batch(tiny_tts):
    return BatchTTS(tiny_tts)


@pytest.fixture(scope="module")
def lines(voices):
    """Mixed voices, modes, languages and text lengths, so prompts pad differently."""
    return [
        Line("This is the longest line of the whole script, in the cloned ICL voice.", voices["icl"], "English"),
        Line("Short one.", voices["xvec"], "English"),
        Line("Another line, a bit longer.", voices["icl"], "Auto"),
        Line("Hi.", voices["xvec"], "German"),
        Line("Okay then, fine by me.", voices["icl"], "French"),
    ]


@contextlib.contextmanager
def talker_logits(force_eos=None, never_eos=False, eos_first=False):
    """Record the talker's code-0 logits per step ([B, V] each), as the decode loop hands them to upstream's
    logits rules (morph.decode.sampling.TalkerRules); force EOS for {row: step}, never allow it, or make it every
    step's likeliest token (`eos_first`: each row ends as soon as the rules let EOS be drawn)."""
    from morph.decode.sampling import TalkerRules

    real, steps = TalkerRules.next_token, []

    def next_token(rules, logits, *args, **kwargs):
        logits = logits.clone()
        step = len(steps) + 1
        for row, at in (force_eos or {}).items():
            if at == step:
                logits[row] = -float("inf")
                logits[row, rules.eos] = 0.0
        if never_eos:
            logits[:, rules.eos] = -float("inf")
        if eos_first:
            logits[:, rules.eos] = logits.max() + 100.0
        steps.append(logits.clone())
        return real(rules, logits, *args, **kwargs)

    TalkerRules.next_token = next_token
    try:
        yield steps
    finally:
        TalkerRules.next_token = real


# -- batch invariance ------------------------------------------------------------------------
def test_a_row_never_sees_its_companions_data(tiny_tts, batch, lines, voices):
    """Fixed shape (batch size, padded length) and row position: the row's logits are bit-identical
    whatever its companions hold: other texts, voices, modes, languages and EOS steps."""
    x = lines[0]  # the longest prompt, so the padded length is the same in both batches
    others = [Line("Completely different words.", voices["xvec"], "Spanish"), Line("Yes.", voices["icl"], "English")]
    with talker_logits(force_eos={1: 4, 2: 6}) as a:
        codes_a = batch.codes([x, lines[1], lines[2]], greedy(frames=10))
    with talker_logits(force_eos={1: 3}) as b:
        codes_b = batch.codes([x, *others], greedy(frames=10))
    assert [c.shape[0] for c in codes_a] == [10, 3, 5] and [c.shape[0] for c in codes_b][:2] == [10, 2]
    assert torch.equal(torch.stack(a)[:, 0], torch.stack(b)[:, 0])
    assert torch.equal(codes_a[0], codes_b[0])


@pytest.mark.parametrize("seq_groups", [1, 15])
def test_rows_give_the_single_line_codes_in_any_batch(tiny_tts, batch, lines, seq_groups):
    """Across batch sizes, orders and paddings: the same codes as each line alone, with logits equal
    to rounding (shapes pick different GEMM/attention reductions, see morph/render.py)."""
    settings = greedy(seq_groups)
    single_logits, single_codes = [], []
    for line in lines:
        with talker_logits() as steps:
            single_codes.append(batch.codes([line], settings)[0])
        single_logits.append(torch.stack(steps)[:, 0])
    for order in ([4, 3, 2, 1, 0], [2, 2, 0]):
        with talker_logits() as steps:
            codes = batch.codes([lines[i] for i in order], settings)
        logits = torch.stack(steps)
        for row, i in enumerate(order):
            assert torch.equal(codes[row], single_codes[i]), (order, row)
            torch.testing.assert_close(logits[:, row], single_logits[i], rtol=0, atol=1e-4)


def test_a_batch_of_64_rows(batch, lines):
    settings = greedy(frames=5)
    alone = [batch.codes([line], settings)[0] for line in lines]
    picked = [lines[i % len(lines)] for i in range(64)]
    codes = batch.codes(picked, settings)
    assert len(codes) == 64
    for i, got in enumerate(codes):
        assert torch.equal(got, alone[i % len(lines)]), i


def test_rows_stop_at_their_own_eos(tiny_tts, batch, lines):
    """Different EOS steps per row: each row's codes are the single line's codes with the same EOS."""
    eos_at = {0: 4, 1: 7, 3: 3}  # row 2 runs to the frame limit
    picked = [lines[0], lines[1], lines[2], lines[3]]
    with talker_logits(force_eos=eos_at):
        codes = batch.codes(picked, greedy(frames=10))
    assert [c.shape[0] for c in codes] == [3, 6, 10, 2]
    for row, line in enumerate(picked):
        force = {0: eos_at[row]} if row in eos_at else None
        with talker_logits(force_eos=force):
            alone = batch.codes([line], greedy(frames=10))[0]
        assert torch.equal(codes[row], alone)


@pytest.mark.parametrize("mode", ["eager", "lean"])
def test_eos_is_held_back_for_min_new_tokens_frames(tiny_tts, batch, lines, mode):
    """A talker that would end every row at once: each row makes min_new_tokens frames (upstream's 2 by default),
    then ends, in eager's static batches and the continuous batch alike; its frame limit still comes first."""
    tiny_tts.patch.mode = mode
    try:
        with talker_logits(eos_first=True):
            made = [[c.shape[0] for c in batch.codes(lines[:3], settings)]
                    for settings in (greedy(frames=10), greedy(frames=10, min_new_tokens=6),
                                     greedy(frames=4, min_new_tokens=6))]
    finally:
        tiny_tts.patch.mode = "auto"
        tiny_tts.release_device_state()
    assert made == [[2] * 3, [6] * 3, [4] * 3]


def test_each_row_keeps_its_own_text_derived_frame_limit(tiny_tts, batch, voices, monkeypatch):
    """With the automatic limit, the batch runs to the largest and each row is cut to its own: the frames
    a single-line clone gives (EOS suppressed, so every row reaches its limit)."""
    import morph.settings

    monkeypatch.setattr(morph.settings, "default_max_frames", lambda text: 3 + len(text) // 4)
    settings = greedy(frames=None)
    picked = [Line("Hi.", voices["xvec"]), Line("A somewhat longer line.", voices["icl"]),
              Line("Middle size.", voices["xvec"])]
    with talker_logits(never_eos=True):
        codes = batch.codes(picked, settings)
        singles = []
        for line in picked:
            with recorded_codes(tiny_tts.tts) as rec:
                tiny_tts.clone(line.text, line.voice, line.language, settings)
            singles.append(rec[0][0])
    assert [c.shape[0] for c in codes] == [3 + len(l.text) // 4 for l in picked]
    for got, want in zip(codes, singles, strict=True):
        assert torch.equal(got, want)


def test_the_codec_decodes_a_batch_as_each_row_alone_to_rounding(batch, voices):
    """One codec call for the batch: every row's audio is its own decode to rounding (not bit for bit:
    the batch changes the convolutions' and GEMMs' reduction order), ICL reference audio cut off, and a
    row without frames silent."""
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in (7, 0, 31, 12)]
    row_voices = [voices["icl"], voices["xvec"], voices["xvec"], voices["icl"]]
    together = batch.decode(codes, row_voices)
    assert [a.size for a in together[1:3]] == [0, 31 * 1920]
    for c, v, got in zip(codes, row_voices, together, strict=True):
        alone = batch.decode([c], [v])[0]
        assert got.dtype == np.float32 and got.shape == alone.shape
        assert abs(got.size - c.shape[0] * 1920) <= 1  # ICL: the reference part is cut at a rounded sample
        assert_audio_close(got, alone, rel=1e-5)


# -- render: order, batching, callbacks --------------------------------------------------------
def test_render_returns_lines_in_order_whatever_the_batching(batch, lines):
    picked = lines[1:4]
    settings = greedy(frames=6)
    one_by_one = [batch.render([line], settings)[0] for line in picked]
    for batch_size in (2, 64):
        got = batch.render(picked, settings, batch_size=batch_size)
        assert len(got) == len(picked)
        for a, b in zip(got, one_by_one, strict=True):
            assert a.dtype == np.float32 and a.ndim == 1 and a.size % 1920 == 0
            assert_audio_close(a, b, rel=5e-4)


def test_progress_counts_frame_slots_across_batches_and_completes(batch, lines):
    calls = []
    batch.render(lines[1:4], greedy(frames=4), batch_size=2, on_step=lambda d, n: calls.append((d, n)))
    # batches of 2 and 1 rows; each decode step of a batch is one slot per row, 4 frame steps at most:
    # the first batch counts 2, 4, 6, 8 and the second starts at 8 even if the first ended early
    assert {n for _, n in calls} == {(2 + 1) * 4}
    done = [d for d, _ in calls]
    assert done == sorted(done) and set(done) <= {2, 4, 6, 8, 9, 10, 11, 12} and done[0] == 2 and 9 in done
    assert calls[-1] == (12, 12), "the last report says the render is done, though EOS left slots unused"


class Cancelled(Exception):
    pass


def test_cancel_propagates_and_finished_lines_were_already_handed_out(tiny_tts, batch, lines):
    finished = {}
    batches = []

    def on_step(done, total):
        if done > 2 * 4 and not batches:  # into the second batch of two rows
            batches.append(done)
            raise Cancelled

    with pytest.raises(Cancelled):
        batch.render(lines[:4], greedy(frames=4), batch_size=2, on_step=on_step,
                     on_line=lambda i, audio: finished.__setitem__(i, audio))
    assert len(finished) == 2  # the first batch's two lines
    again = batch.render([lines[i] for i in sorted(finished)], greedy(frames=4), batch_size=2, sort=False)
    for got, i in zip(again, sorted(finished), strict=True):
        np.testing.assert_array_equal(got, finished[i])


def out_of_memory_above(tts, rows, monkeypatch):
    """Make the decode seam (talker.generate, answered by the morph patch) raise CUDA out-of-memory for
    batches of more than `rows` rows; returns the batch sizes it was called with."""
    seam, sizes = tts.tts.model.talker.generate, []

    def generate(*args, **kwargs):
        sizes.append(kwargs["inputs_embeds"].shape[0])
        if sizes[-1] > rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return seam(*args, **kwargs)

    monkeypatch.setattr(tts.tts.model.talker, "generate", generate)
    return sizes


def test_out_of_memory_halves_the_batch_and_keeps_the_smaller_size(tiny_tts, batch, lines, monkeypatch, caplog):
    settings = greedy(frames=4)
    alone = [batch.render([line], settings)[0] for line in lines[1:]]
    sizes = out_of_memory_above(tiny_tts, 2, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="morph.render"):
        got = batch.render(lines[1:], settings, batch_size=8)
    assert sizes == [4, 2, 2]
    for a, b in zip(got, alone, strict=True):
        assert_audio_close(a, b, rel=5e-4)
    assert "retrying in batches of 2" in caplog.text and "set batch_size to 2" in caplog.text


def test_out_of_memory_in_the_codec_decode_halves_too(tiny_tts, batch, lines, monkeypatch):
    tokenizer = tiny_tts.tts.model.speech_tokenizer
    decode, sizes = tokenizer.decode, []

    def small_decode(items):
        sizes.append(len(items))
        if len(items) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return decode(items)

    monkeypatch.setattr(tokenizer, "decode", small_decode)
    got = batch.render(lines[1:3], greedy(frames=4), batch_size=2)
    assert sizes == [2, 1, 1] and all(a.size for a in got)


def test_out_of_memory_on_a_single_row_is_a_clear_error(tiny_tts, batch, lines, monkeypatch):
    out_of_memory_above(tiny_tts, 0, monkeypatch)
    with pytest.raises(RuntimeError, match=r"^Render lines \(line \d\): the GPU ran out of memory rendering a "
                                           r"single row .*Unload models.*bf16"):
        batch.render(lines[:2], greedy(), batch_size=2)


def test_a_line_too_long_for_one_pass_is_rendered_in_segments(batch, voices, monkeypatch):
    monkeypatch.setattr(prompts_module, "MAX_SEGMENT_CHARS", 30)
    text = "The first sentence is here. And then a second one follows."
    settings = greedy(frames=5)
    whole = batch.render([Line(text, voices["xvec"])], settings)[0]
    parts = batch.render([Line("The first sentence is here.", voices["xvec"]),
                          Line("And then a second one follows.", voices["xvec"])], settings)
    pause = np.zeros(int(SEGMENT_PAUSE_SECONDS * SR), np.float32)
    assert_audio_close(whole, np.concatenate([parts[0], pause, parts[1]]), rel=5e-4)
    with pytest.raises(ValueError, match="over the 30-character limit"):
        batch.codes([Line(text, voices["xvec"])], settings)


def test_segments_join_in_order_every_one_with_a_pause_between_each_two():
    """join_with_pauses, which turns a long line's segment audio back into the line: each segment once, in order,
    a pause between each two and none at either end (a dropped first or last segment shows as a short join)."""
    from morph.line_audio import join_with_pauses

    pieces = [np.full(n, v, np.float32) for n, v in ((3, 1.0), (5, 2.0), (2, 3.0))]
    pause = np.zeros(int(SEGMENT_PAUSE_SECONDS * SR), np.float32)
    np.testing.assert_array_equal(join_with_pauses(pieces),
                                  np.concatenate([pieces[0], pause, pieces[1], pause, pieces[2]]))
    np.testing.assert_array_equal(join_with_pauses(pieces[:1]), pieces[0])


# -- errors --------------------------------------------------------------------------------------
def test_bad_lines_are_clear_errors_naming_the_line(batch, voices):
    ok = Line("Fine.", voices["xvec"])
    with pytest.raises(ValueError, match=r"^Render lines \(line 2\): text is empty"):
        batch.render([ok, Line("  ", voices["xvec"])])
    with pytest.raises(ValueError, match=r"^Render lines \(line 2\): language 'Klingon' is not supported"):
        batch.render([ok, Line("Hi.", voices["xvec"], "Klingon")])
    with pytest.raises(ValueError, match=r"^Render lines: language 'Klingon'"):  # a single line needs no number
        batch.render([Line("Hi.", voices["xvec"], "Klingon")])
    with pytest.raises(ValueError, match=r"^Render lines \(Bob's line\): text is empty"):
        batch.render([Line(" ", voices["xvec"])], labels=["Bob's line"])
    with pytest.raises(ValueError, match=r"^Render lines needs a CustomVoice model"):
        batch.render([ok, Line("Hi.", speaker="vivian")])
    alien = type(voices["xvec"])(torch.zeros(2048), None, None, "1b7")
    with pytest.raises(ValueError, match=r"^Render lines \(line 2\): this voice was made with a 1.7B model"):
        batch.render([ok, Line("Hi.", alien)])
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        batch.render([ok], batch_size=0)
    assert batch.render([]) == [] and batch.codes([]) == []


def test_the_lean_codec_hands_each_row_its_own_audio_whatever_order_its_calls_end(tiny_tts):
    """BatchTTS.decode through decode_whole (morph/codec/stream.py), which decodes rows of like length together:
    rows of very different lengths are decoded out of order, and each must still get its own audio (the row decoded
    alone)."""
    g = torch.Generator().manual_seed(5)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in (40, 7, 130, 19)]
    mode, tiny_tts.patch.mode = tiny_tts.patch.mode, "lean"  # the lean codec: every mode but eager
    try:
        batch = BatchTTS(tiny_tts)
        together = batch.decode(codes, [None] * len(codes))
        for c, audio in zip(codes, together, strict=True):
            assert_audio_close(audio, batch.decode([c], [None])[0], rel=1e-5)
    finally:
        tiny_tts.patch.mode = mode
