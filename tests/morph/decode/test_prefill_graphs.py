"""morph/decode/prefill_graphs.py on the CPU (tiny model, fp32): a slice loaded into a larger bucket (more rows, a
longer prompt) and run op by op, as its CUDA graph replays it, gives lean_prefill's outputs over the slice alone,
whatever an earlier slice left in the arena; outside the fast modes a slice runs lean_prefill itself and nothing is
captured; a server's buckets, captured before its first request, are one and two rows at every length up to
LIVE_LONGEST. The captures themselves: tests/gpu/test_prefill.py."""

from __future__ import annotations

import torch

from morph.decode.prefill_graphs import Arena, Bucket, PrefillGraphs, live_shapes, voice_shapes
from morph.settings import prefill_bucket

from .prefill_case import alone, assert_same, slice_of


def test_a_slice_padded_to_a_larger_bucket_gives_its_own_prefill(tiny_tts):
    loop, embeds, mask, tables = slice_of(tiny_tts)
    rows, length = mask.shape
    assert 0 < int(mask[0].sum()) < length  # the first row is left-padded within the slice already
    with torch.inference_mode():
        arena = Arena(loop, 4 * (length + 9), embeds, mask)
        bucket = Bucket(arena, loop, 4, length + 9)
        bucket.load(embeds, mask)
        bucket.step()
        got = bucket.out(rows, length)
        assert_same(got, alone(loop, embeds, mask, tables))
        for k, v in bucket.kv:  # the added rows and tokens are padding: what they compute stays finite
            assert torch.isfinite(k).all() and torch.isfinite(v).all()

        # a shorter slice after it, in the same bucket: nothing of the first one's reaches it (its second row's
        # tokens before these are still in the arena)
        short = int(mask[0].sum())
        last = (embeds[:, -short:], mask[:, -short:])
        bucket.load(*last)
        bucket.step()
        assert_same(bucket.out(rows, short), alone(loop, *last, tables))


def test_outside_the_fast_modes_a_slice_runs_the_lean_prefill(tiny_tts):
    loop, embeds, mask, tables = slice_of(tiny_tts)
    graphs = PrefillGraphs()
    with torch.inference_mode():
        got = graphs.prefill(loop, embeds, mask, tables, captured=False)
        want = alone(loop, embeds, mask, tables)
    for (k, v), (k2, v2) in zip(got.kv, want.kv, strict=True):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    assert torch.equal(got.logits, want.logits) and len(graphs.graphs) == 0


def test_a_voices_buckets_are_every_row_count_a_batch_or_a_slice_holds_the_largest_first():
    assert voice_shapes(16, 64) == [(64, 16), (32, 16), (16, 16), (8, 16), (4, 16), (2, 16), (1, 16)]
    assert voice_shapes(16, 48) == [(64, 16), (32, 16), (16, 16), (8, 16), (4, 16), (2, 16), (1, 16)]  # 48 pads to 64
    assert voice_shapes(141, 64) == [(8, 192), (4, 192), (2, 192), (1, 192)]  # a slice holds 2048 // 192 rows
    assert voice_shapes(16, 1) == [(1, 16)] and voice_shapes(2049, 64) == []  # past the longest: op by op


def test_a_servers_buckets_are_one_and_two_rows_at_every_length_up_to_its_longest_the_largest_first():
    shapes = live_shapes(1023)  # the server's LIVE_MAX_PROMPT
    lengths = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
    assert sorted(shapes) == sorted((rows, n) for rows in (1, 2) for n in lengths)
    assert all(prefill_bucket(*s) == s for s in shapes)  # each a bucket of its own
    tokens = [rows * n for rows, n in shapes]
    assert tokens == sorted(tokens, reverse=True) and shapes[0] == (2, 1024)  # the arena is sized by the first
    assert max(n for _, n in live_shapes(256)) == 256 and max(n for _, n in live_shapes(257)) == 384
    assert len(live_shapes(16)) == 2 and len(live_shapes(9999)) == 2 * 15  # past the longest bucket: every one
