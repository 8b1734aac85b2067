"""morph/codec/stream.py's CodecStream: ended rows decoded whole in groups of like length, at most IN_FLIGHT groups
under way, each row's audio handed back under its own name (tiny model, CPU, fp32)."""

from __future__ import annotations

import torch

from morph.codec.pieces import decode_rows
from morph.codec.stream import IN_FLIGHT, CodecStream
from tests.audio_compare import assert_audio_close


def test_each_row_gets_its_own_audio_once_whatever_group_it_went_in(tiny_tts):
    """Rows of very different lengths, submitted out of length order and pumped as the continuous batch pumps
    (after each frame, with the rows that ended since, then flushed): groups form by length, so rows come back in another order than they
    went in, and each name must still get its own row's audio (upstream's decode of that row alone), exactly once.
    An ICL row (reference codes in front) and a row without frames go through too."""
    g = torch.Generator().manual_seed(2)
    lengths = {"a": 40, "b": 7, "c": 130, "d": 19, "e": 0, "f": 64, "g": 9}
    codes = {name: torch.randint(0, 2048, (n, 16), generator=g) for name, n in lengths.items()}
    refs = {name: torch.randint(0, 2048, (12, 16), generator=g) if name == "d" else None for name in codes}
    stream = CodecStream(tiny_tts.codec, torch.device("cpu"), None, budget=96)  # several groups
    got, order = {}, []
    for ended in (["a", "b", "c", "d"], ["e", "f", "g"]):  # the rows that ended since the last pump
        for name in ended:
            stream.submit(name, codes[name], refs[name])
        for done, audio in stream.pump():
            assert done not in got, f"{done} handed back twice"
            got[done] = audio
            order.append(done)
        assert len(stream.flight) <= IN_FLIGHT
    for done, audio in stream.pump(flush=True):
        assert done not in got, f"{done} handed back twice"
        got[done] = audio
        order.append(done)
    assert sorted(order) == sorted(codes) and order != list(codes)  # all back, not in the order submitted
    assert not stream.waiting and not stream.flight
    for name, c in codes.items():
        want = decode_rows(tiny_tts.tts.model.speech_tokenizer, [c], [refs[name]], budget=10**6)[0]
        assert got[name].shape == want.shape, name
        if want.size:
            assert_audio_close(got[name], want, rel=1e-5)
