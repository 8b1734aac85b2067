"""morph/codec/stream.py's decode_whole: rows already made, decoded whole in calls of like length, each row's audio
back in its own place (tiny model, CPU, fp32)."""

from __future__ import annotations

import torch

from morph.codec.pieces import decode_rows
from morph.codec.stream import decode_whole
from tests.audio_compare import assert_audio_close


def test_each_row_gets_its_own_audio_whatever_call_it_went_in(tiny_tts, monkeypatch):
    """Rows of very different lengths, out of length order, under a budget that makes several calls: calls form by
    length, so rows are decoded in another order than given, and each must still get its own row's audio
    (upstream's decode of that row alone). An ICL row (reference codes in front) and a row without frames go through
    too."""
    g = torch.Generator().manual_seed(2)
    lengths = [40, 7, 130, 19, 0, 64, 9]
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in lengths]
    refs = [torch.randint(0, 2048, (12, 16), generator=g) if i == 3 else None for i in range(len(codes))]
    calls = []
    decode = tiny_tts.codec.decode
    monkeypatch.setattr(tiny_tts.codec, "decode", lambda c, s: calls.append(c.shape[0]) or decode(c, s))
    got = decode_whole(tiny_tts.codec, codes, refs, torch.device("cpu"), None, budget=96)
    assert len(calls) >= 3  # the budget splits the rows into several calls
    for c, ref, audio in zip(codes, refs, got, strict=True):
        want = decode_rows(tiny_tts.tts.model.speech_tokenizer, [c], [ref], budget=10**6)[0]
        assert audio.shape == want.shape
        if want.size:
            assert_audio_close(audio, want, rel=1e-5)
