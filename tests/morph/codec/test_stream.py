"""morph/codec/stream.py, the one streamer: rows fed a chunk at a time (as the continuous batch feeds them) and rows
fed whole (decode_whole, BatchTTS.decode's) give upstream's decode of each row to rounding, whatever the chunks, the
calls a row shares and its ICL reference, across upstream's 300-frame windows too (tiny model, CPU, fp32)."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from morph.codec.calls import LIVE_CHUNK, LIVE_ROW_FRAMES
from morph.codec.layers import LeanCodec
from morph.codec.pieces import decode_rows
from morph.codec.stream import CodecStream, decode_whole
from tests.audio_compare import assert_audio_close

CPU = torch.device("cpu")
FRAME = 1920  # samples a frame at 24 kHz


def streamed(codec, codes, refs, sizes, device=CPU, budget=LIVE_ROW_FRAMES):
    """Rows through one CodecStream as the continuous batch feeds it: call k gives every row still going its next
    sizes[k] frames (a row's last chunk shorter, padded in the call), and chunks are read back as they come; a row
    without frames ends at once. Each row's chunks and its whole audio."""
    live = CodecStream(codec, device, budget)
    for i, ref in enumerate(refs):
        live.open(i, ref)
        if not codes[i].shape[0]:
            live.end(i)
    chunks, whole = {i: [] for i in range(len(codes))}, {}

    def take(pumped):
        for name, chunk, all_of_it in pumped:
            chunks[name].append(chunk)
            if all_of_it is not None:
                whole[name] = all_of_it

    done = 0
    for size in sizes:
        going = [i for i, c in enumerate(codes) if c.shape[0] > done]
        if not going:
            break
        live.feed(going, [codes[i][done:done + size] for i in going], size,
                  [codes[i].shape[0] <= done + size for i in going])
        done += size
        take(live.pump())
    take(live.pump(flush=True))
    assert not live.rows and not live.flight
    for i in chunks:
        assert np.array_equal(np.concatenate(chunks[i]), whole[i]), i
    return [chunks[i] for i in range(len(codes))], [whole[i] for i in range(len(codes))]


@pytest.fixture(scope="module")
def rows():
    """A row past upstream's 300-frame window (its later window decoded apart, as upstream does), ICL references in
    front of two rows, a row of one frame and one of none."""
    g = torch.Generator().manual_seed(1)
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in (37, 1, 0, 80, 340)]
    refs = [None, torch.randint(0, 2048, (20, 16), generator=g), None, None,
            torch.randint(0, 2048, (40, 16), generator=g)]
    return codes, refs


@pytest.mark.parametrize("chunk", [3, 7, 16, 400])  # 3: fewer frames a call than a kernel is wide
def test_rows_fed_a_chunk_at_a_time_are_upstreams_decode(tiny_tts, rows, chunk):
    codes, refs = rows
    want = decode_rows(tiny_tts.tts.model.speech_tokenizer, codes, refs, budget=10**6)
    _, got = streamed(tiny_tts.codec, codes, refs, itertools.repeat(chunk), budget=48)
    assert [a.shape for a in got] == [w.shape for w in want] and got[2].size == 0
    for a, w in zip(got, want, strict=True):
        assert a.dtype == np.float32
        assert_audio_close(a, w, rel=1e-5)


def test_rows_decoded_whole_are_upstreams_decode_and_a_row_of_a_batch_as_alone(tiny_tts, rows):
    codes, refs = rows
    want = decode_rows(tiny_tts.tts.model.speech_tokenizer, codes, refs, budget=10**6)
    together = decode_whole(tiny_tts.codec, codes, refs, CPU)
    alone = decode_whole(tiny_tts.codec, codes[3:4], refs[3:4], CPU)
    assert [a.shape for a in together] == [w.shape for w in want]
    for a, w in zip(together, want, strict=True):
        assert_audio_close(a, w, rel=1e-5)
    assert_audio_close(together[3], alone[0], rel=1e-5)


def test_each_row_gets_its_own_audio_whatever_call_it_went_in(tiny_tts, monkeypatch):
    """decode_whole: rows of very different lengths, out of length order, under a budget that makes several calls:
    calls form by length, so rows are decoded in another order than given, and each must still get its own row's
    audio (upstream's decode of that row alone). An ICL row (reference codes in front) and a row without frames go
    through too."""
    g = torch.Generator().manual_seed(2)
    lengths = [40, 7, 130, 19, 0, 64, 9]
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in lengths]
    refs = [torch.randint(0, 2048, (12, 16), generator=g) if i == 3 else None for i in range(len(codes))]
    calls = []
    decode = tiny_tts.codec.decode
    monkeypatch.setattr(tiny_tts.codec, "decode", lambda c, s: calls.append(c.shape[0]) or decode(c, s))
    got = decode_whole(tiny_tts.codec, codes, refs, CPU, budget=96)
    assert len(calls) >= 3  # the budget splits the rows into several calls
    for c, ref, audio in zip(codes, refs, got, strict=True):
        want = decode_rows(tiny_tts.tts.model.speech_tokenizer, [c], [ref], budget=10**6)[0]
        assert audio.shape == want.shape and audio.dtype == np.float32
        if want.size:
            assert_audio_close(audio, want, rel=1e-5)


@pytest.fixture(scope="module")
def wide_codec(tiny_tts):
    """The tiny codec attending to 64 frames, not 16, with its transformer's layer scales at 1, not ~1e-9: a frame's
    audio then depends on more than the 25 frames of context upstream decodes a later window behind (as the real
    codec's does, over 72 frames), so that a window decoded apart differs from one decoded on (by 5e-4 of the peak)."""
    model = copy.deepcopy(tiny_tts.tts.model.speech_tokenizer.model)
    for module in model.decoder.modules():
        if hasattr(getattr(module, "config", None), "sliding_window"):
            module.config.sliding_window = 64
        for name in ("sliding_window", "window_size"):
            if isinstance(getattr(module, name, None), int):
                setattr(module, name, 64)
    with torch.no_grad():
        for layer in model.decoder.pre_transformer.layers:
            layer.self_attn_layer_scale.scale.fill_(1.0)
            layer.mlp_layer_scale.scale.fill_(1.0)
    return LeanCodec(model)


def test_a_row_streamed_across_upstreams_windows_is_upstreams_decode(wide_codec):
    """Rows fed as the continuous batch feeds them (several rows a call, a small first chunk, a padded last one):
    rows past upstream's 300-frame window start each window again behind its 25 frames of context, a chunk crossing
    or ending at a window's start included, and a reference past the first window; each row's chunks joined are
    upstream's decode of it (its chunked_decode, the reference's audio cut off), and its decode whole."""
    g = torch.Generator().manual_seed(3)
    lengths = [310, 30, 30, 20, 12, 0, 610]
    # upstream's next window starts at the row's own frame 300 (inside a chunk), 10 (inside a chunk) and 8 (where a
    # chunk ends); the fourth row's reference reaches past the first window; a short row, one without frames, and
    # one over three windows
    refs = [None] + [torch.randint(0, 2048, (n, 16), generator=g) for n in (290, 292, 310)] + [None, None, None]
    codes = [torch.randint(0, 2048, (n, 16), generator=g) for n in lengths]
    chunks, got = streamed(wide_codec, codes, refs, [3, 1, 4] + [LIVE_CHUNK] * 38, budget=40)  # 2 rows a call at 16
    whole = decode_whole(wide_codec, codes, refs, CPU)
    with torch.inference_mode():
        for i, (c, ref) in enumerate(zip(codes, refs, strict=True)):
            assert got[i].shape == whole[i].shape == (lengths[i] * FRAME,), i
            if not lengths[i]:
                continue
            full = c if ref is None else torch.cat((ref, c))
            want = wide_codec.model.decode(full[None], return_dict=False)[0][0][(full.shape[0] - c.shape[0]) * FRAME:]
            assert_audio_close(got[i], want, rel=1e-5)
            assert_audio_close(whole[i], want, rel=1e-5)
    assert [c.size // FRAME for c in chunks[0]] == [3, 1, 4] + [LIVE_CHUNK] * 18 + [310 - 296]


def test_calls_come_in_power_of_two_widths_and_warm_plans_each_of_them(wide_codec, monkeypatch):
    """Three rows fed together are decoded as four (a blank row pads the call, its audio dropped); warm decodes once at
    every width a call of each chunk size can have, up to the batch's rows and the call's budget, the heaviest first
    (under the native allocator a capture reuses what the graphs' pool has free only for calls no larger)."""
    shapes = []
    decode = wide_codec.decode
    monkeypatch.setattr(wide_codec, "decode", lambda codes, state: shapes.append(tuple(codes.shape[:2]))
                        or decode(codes, state))
    live = CodecStream(wide_codec, CPU, budget=40)  # 10 rows a call at 4 frames, 2 at 16
    live.warm(6, (4, 16))
    assert sorted(shapes) == [(1, 4), (1, 16), (2, 4), (2, 16), (4, 4), (8, 4)]
    assert [w * t for w, t in shapes] == sorted((w * t for w, t in shapes), reverse=True)
    shapes.clear()
    codes = torch.randint(0, 2048, (3, 4, 16), generator=torch.Generator().manual_seed(1))
    for i in range(3):
        live.open(i, None)
    live.feed([0, 1, 2], list(codes), 4, [False] * 3)
    alone = CodecStream(wide_codec, CPU, budget=40)
    alone.open(0, None)
    alone.feed([0], [codes[1]], 4, [False])
    assert shapes == [(4, 4), (1, 4)]
    assert [c.size for _, c, _ in live.pump(flush=True)] == [4 * FRAME] * 3
    assert_audio_close(live.rows[1].audio[0], alone.pump(flush=True)[0][1], rel=1e-5)


def test_a_dropped_row_opened_again_gets_none_of_its_first_lifes_audio(wide_codec):
    """A preempted row (the continuous batch's, morph/engine/batch.py) is dropped while its first life's chunk is
    still on its way to the host, then opened again and fed from its first frame: what pump hands out for it is the
    second life's alone, as a row fed those frames from the start gets."""
    codes = torch.randint(0, 2048, (2, 4, 16), generator=torch.Generator().manual_seed(2))
    live = CodecStream(wide_codec, CPU, budget=40)
    live.open("a", None)
    live.feed(["a"], [codes[0]], 4, [False])  # its first life: not pumped yet
    live.drop("a")
    live.open("a", None)
    live.feed(["a"], [codes[1]], 4, [True])
    fresh = CodecStream(wide_codec, CPU, budget=40)
    fresh.open("a", None)
    fresh.feed(["a"], [codes[1]], 4, [True])
    got, want = live.pump(flush=True), fresh.pump(flush=True)
    assert [(name, chunk.size) for name, chunk, _ in got] == [("a", 4 * FRAME)] and not live.rows
    np.testing.assert_array_equal(got[0][2], want[0][2])
