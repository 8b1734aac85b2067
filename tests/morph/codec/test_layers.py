"""morph/codec/layers.py: the lean codec decodes a chunk at a time, each row carrying its state, and gives
upstream's decode to rounding whatever the chunks (tiny model, CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from morph.codec.pieces import decode_rows
from morph.codec.stream import RowsDecode
from tests.audio_compare import assert_audio_close


@pytest.fixture(scope="module")
def rows():
    """A row past upstream's 300-frame window (its tail is upstream's), ICL references in front of two rows, a row
    of one frame and one of none."""
    g = torch.Generator().manual_seed(1)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in (37, 1, 0, 80, 340)]
    refs = [None, torch.randint(0, 2048, (20, 16), generator=g), None, None,
            torch.randint(0, 2048, (40, 16), generator=g)]
    return codes, refs


@pytest.mark.parametrize("chunk", [3, 7, 16, 400])  # 3: fewer frames a call than a kernel is wide
def test_rows_decoded_a_chunk_at_a_time_are_upstreams_decode(tiny_tts, rows, chunk):
    codes, refs = rows
    want = decode_rows(tiny_tts.tts.model.speech_tokenizer, codes, refs, budget=10**6)
    job = RowsDecode(tiny_tts.codec, refs, torch.device("cpu"), None, chunk=chunk, budget=48)
    job.finish(codes)
    got = job.audio()
    assert [a.shape for a in got] == [w.shape for w in want] and got[2].size == 0
    for a, w in zip(got, want, strict=True):
        assert_audio_close(a, w, rel=1e-5)


def test_a_row_of_a_batch_decodes_as_it_does_alone(tiny_tts, rows):
    codes, refs = rows
    together = RowsDecode.whole(tiny_tts.codec, codes, refs, torch.device("cpu"), None).audio()
    alone = RowsDecode.whole(tiny_tts.codec, codes[3:4], refs[3:4], torch.device("cpu"), None).audio()
    assert_audio_close(together[3], alone[0], rel=1e-5)


def test_state_rows_are_views_that_decoding_advances(tiny_tts):
    codec = tiny_tts.codec
    state = codec.zero_state(3, "cpu", torch.float32)
    codec.decode(torch.randint(0, 2048, (2, 5, 16)), state.rows(1, 3))
    assert state.pos.tolist() == [0, 5, 5]
    assert not state.flat[0].any() and state.flat[1:].abs().sum() > 0


def test_a_voice_reference_is_decoded_once_a_chunk_at_a_time(tiny_tts):
    codec = tiny_tts.codec
    ref = torch.randint(0, 2048, (30, 16), generator=torch.Generator().manual_seed(2))
    calls = []
    decode = codec.decode
    codec.decode = lambda codes, state: calls.append(codes.shape[1]) or decode(codes, state)
    try:
        for _ in range(3):
            RowsDecode.whole(codec, [torch.zeros(5, 16, dtype=torch.long)], [ref], torch.device("cpu"), None).audio()
    finally:
        del codec.decode
    assert calls == [16, 14, 16, 16, 16]  # chunk-sized calls (what morph/memory.py counts); 5 frames padded to 16
    codec.release()
    assert not codec._primed
