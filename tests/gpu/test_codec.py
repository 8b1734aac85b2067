"""The lean codec on the GPU: upstream's decode to rounding, whatever the chunks, in fp32 and in bf16."""

import itertools

import numpy as np
import pytest
import torch

from morph.codec.pieces import decode_rows
from morph.codec.stream import CodecStream
from tests.audio_compare import assert_audio_close
from tests.morph.codec.test_stream import streamed


def _rows(g):
    # a row past upstream's first 300-frame window, ICL references in front of two rows, a row of one frame
    lengths, refs = (37, 1, 80, 350), (None, 20, None, 40)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in lengths]
    return codes, [None if r is None else torch.randint(0, 2048, (r, 16), generator=g) for r in refs]


def _stream(codec, codes, refs, chunk):
    return streamed(codec, codes, refs, itertools.repeat(chunk), torch.device("cuda"))[1]


@pytest.mark.parametrize("chunk", [1, 16, 400])
def test_audio_a_chunk_at_a_time_is_upstreams_decode_in_fp32(cuda_tts, chunk):
    codes, refs = _rows(torch.Generator().manual_seed(chunk))
    want = decode_rows(cuda_tts.tts.model.speech_tokenizer, codes, refs, budget=10**6)
    got = _stream(cuda_tts.codec, codes, refs, chunk)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == np.float32
        # cuDNN runs fp32 convolutions in TF32 (torch's default), upstream's and the lean layout's each their way
        assert_audio_close(a, b, rel=2e-3)


def test_bf16_is_as_close_to_the_exact_decode_as_upstreams_bf16(cuda_tts):
    tokenizer = cuda_tts.tts.model.speech_tokenizer
    codes, refs = _rows(torch.Generator().manual_seed(9))
    exact = np.concatenate(decode_rows(tokenizer, codes, refs))
    tokenizer.model.to(torch.bfloat16)
    try:
        upstream = np.concatenate(decode_rows(tokenizer, codes, refs))
        lean = np.concatenate(_stream(cuda_tts.codec, codes, refs, 16))
    finally:
        tokenizer.model.to(torch.float32)

    def err(x):
        return float(np.sqrt(np.mean((x - exact) ** 2)))

    assert err(lean) <= 1.5 * err(upstream) + 1e-4, (err(lean), err(upstream))


def test_the_captured_decode_is_the_op_by_op_decode_call_for_call(cuda_tts):
    """LeanCodec.captured (the live rows' calls in the fast modes): chunk by chunk, each call's audio and the rows'
    advanced state are the op-by-op decode's, one graph per shape, and a later call of the same shape leaves an
    earlier call's audio as it was."""
    codec, dev = cuda_tts.codec, torch.device("cuda")
    dtype = next(codec.decoder.parameters()).dtype
    captured = codec.captured(dev)
    eager, graphed = codec.zero_state(4, dev, dtype), codec.zero_state(4, dev, dtype)
    g = torch.Generator().manual_seed(5)
    for frames in (4, 4, 16, 4):
        codes = torch.randint(0, 2048, (4, frames, 16), generator=g).cuda()
        want = codec.decode(codes, eager)
        got = captured.decode(codes, graphed)
        kept = got.clone()
        captured.decode(torch.zeros_like(codes), codec.zero_state(4, dev, dtype))
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(graphed.flat, eager.flat)
        assert torch.equal(graphed.pos, eager.pos) and torch.equal(got, kept)
    assert len(captured.graphs) == 2 and not captured.graphs.failed


def test_warm_captures_each_call_shape_once_a_process(cuda_tts, monkeypatch):
    """CodecStream.warm in the captured modes: the first render's warm captures every shape its calls can take; the
    next render's replays none of them (each did, every render, before 2026-11-26c), and a new shape is still
    captured."""
    from morph.graphs import CapturedStep

    codec, dev = cuda_tts.codec, torch.device("cuda")
    captured = codec.captured(dev)
    captured.graphs.clear()
    replays = []
    replay = CapturedStep.replay
    monkeypatch.setattr(CapturedStep, "replay", lambda self: replays.append(self) or replay(self))
    CodecStream(codec, dev, captured=True).warm(3, (4, 16))
    shapes = [(1, 4), (2, 4), (4, 4), (1, 16), (2, 16), (4, 16)]
    assert all(s in captured.graphs for s in shapes) and len(captured.graphs) == 6 and not captured.graphs.failed
    replays.clear()
    CodecStream(codec, dev, captured=True).warm(3, (4, 16))
    assert replays == [] and len(captured.graphs) == 6
    CodecStream(codec, dev, captured=True).warm(8, (4,))
    assert (8, 4) in captured.graphs and len(captured.graphs) == 7
