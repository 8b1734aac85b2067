"""morph/codec/layers.py: the lean codec's rows carry their state from one call to the next, and an ICL voice's
reference is decoded once, a chunk at a time (tiny model, CPU, fp32). Its audio against upstream's decode, whatever
the chunks: tests/morph/codec/test_stream.py."""

from __future__ import annotations

import torch

from morph.codec.stream import decode_whole


def test_state_rows_are_views_that_decoding_advances(tiny_tts):
    codec = tiny_tts.codec
    state = codec.zero_state(3, "cpu", torch.float32)
    codec.decode(torch.randint(0, 2048, (2, 5, 16)), state.rows(1, 3))
    assert state.pos.tolist() == [0, 5, 5]
    assert not state.flat[0].any() and state.flat[1:].abs().sum() > 0


def test_a_voice_reference_is_decoded_once_by_its_codes_a_chunk_at_a_time(tiny_tts):
    codec = tiny_tts.codec
    ref = torch.randint(0, 2048, (30, 16), generator=torch.Generator().manual_seed(2))
    calls = []
    decode = codec.decode
    codec.decode = lambda codes, state: calls.append(codes.shape[1]) or decode(codes, state)
    try:
        for same in (ref, ref, ref.clone()):  # a voice read again (the server's, each request) has new tensors
            decode_whole(codec, [torch.zeros(5, 16, dtype=torch.long)], [same], torch.device("cpu"))
        decode_whole(codec, [torch.zeros(5, 16, dtype=torch.long)], [ref[:20]], torch.device("cpu"))  # another
    finally:
        del codec.decode
    # chunk-sized calls (what morph/memory.py counts); 5 frames padded to 16; the second reference primed too
    assert calls == [16, 14, 16, 16, 16, 16, 4, 16]
    codec.release()
    assert not codec._primed
