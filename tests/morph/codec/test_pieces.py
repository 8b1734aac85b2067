"""morph/codec/pieces.py: upstream's decoder over rows in pieces of bounded size, each row's audio what one codec call
for the whole batch gives it, to rounding (tiny model, CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morph.codec.pieces import CODEC_WINDOW, decode_rows, pieces
from tests.audio_compare import assert_audio_close


def test_pieces_keep_rows_times_the_longest_within_the_budget():
    lengths = [40, 0, 10, 30, 10, 200, 400, 25]
    got = pieces(lengths, budget=64)
    assert sorted(i for p in got for i in p) == [0, 2, 3, 4, 5, 6, 7]  # every spoken row once, the empty one nowhere
    for piece in got:
        assert piece == sorted(piece)  # in the order given
        heaviest = max(min(lengths[i], CODEC_WINDOW) for i in piece)
        assert len(piece) == 1 or len(piece) * heaviest <= 64
    assert [5] in got and [6] in got  # heavier than the budget alone: a piece each
    assert [2, 4] in got  # the two short rows share one


def test_pieces_hold_a_whole_batch_that_fits_as_one_call():
    assert pieces([7, 31, 12], budget=512) == [[0, 1, 2]]
    assert pieces([], budget=512) == []


def test_a_row_counts_at_most_the_codec_window():
    # upstream's decoder runs 325 frames at a time, so a 900-frame row weighs no more than a 325-frame one
    assert pieces([900, 900], budget=2 * CODEC_WINDOW) == [[0, 1]]


@pytest.fixture(scope="module")
def codec(tiny_tts):
    return tiny_tts.tts.model.speech_tokenizer


@pytest.fixture(scope="module")
def ref_code():
    return torch.randint(0, 2048, (9, 16), generator=torch.Generator().manual_seed(1))


def test_pieces_decode_each_row_as_one_call_for_the_batch_does(codec, ref_code):
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in (7, 0, 31, 12, 5)]
    refs = [ref_code, None, None, ref_code, None]
    calls = []
    decode = codec.decode
    codec.decode = lambda batch: calls.append(len(batch)) or decode(batch)
    try:
        whole = decode_rows(codec, codes, refs, budget=10**6)
        split = decode_rows(codec, codes, refs, budget=32)
    finally:
        del codec.decode
    assert calls[0] == 4 and len(calls) > 2 and sum(calls[1:]) == 4  # one call, then several for the same rows
    assert [a.size for a in split[1:3]] == [0, 31 * 1920]
    for one, many, c in zip(whole, split, codes, strict=True):
        assert many.dtype == np.float32 and many.shape == one.shape
        assert abs(many.size - c.shape[0] * 1920) <= 1  # ICL: the reference part is cut at a rounded sample
        assert_audio_close(many, one, rel=1e-5)

