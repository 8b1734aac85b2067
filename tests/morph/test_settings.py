"""morph/settings.py's prefill slices and buckets: what a slice of joining rows holds and the shape its CUDA graph is
captured at (morph/decode/prefill_graphs.py); the generation settings' checks."""

from __future__ import annotations

import pytest

from morph.settings import (MIN_CAPACITY, PREFILL_LENGTHS, PREFILL_TOKENS, GenerationSettings, prefill_bucket,
                            prefill_rows, text_slots)


@pytest.mark.parametrize("length", [1, 15, 16, 17, 24, 25, 60, 100, 700, 1500, 2048])
def test_a_bucket_is_the_next_length_at_most_half_as_long_again(length):
    rows, padded = prefill_bucket(1, length)
    assert rows == 1 and padded in PREFILL_LENGTHS and padded >= length
    assert padded <= max(PREFILL_LENGTHS[0], 1.5 * length)
    assert all(b < length for b in PREFILL_LENGTHS if b < padded)  # the smallest that holds it


@pytest.mark.parametrize(("rows", "padded"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (33, 64)])
def test_a_bucket_holds_its_rows_in_a_power_of_two(rows, padded):
    assert prefill_bucket(rows, 30) == (padded, 32)


def test_a_prompt_past_the_longest_bucket_has_none():
    assert prefill_bucket(1, PREFILL_LENGTHS[-1] + 1) is None


@pytest.mark.parametrize("length", [1, 16, 20, 60, 61, 130, 700, 2048, 3000])
def test_a_slice_is_the_most_rows_whose_bucket_fits_the_prefill_bound(length):
    rows = prefill_rows(length)
    assert rows >= 1 and rows & (rows - 1) == 0  # a power of two: its own bucket
    bucket = prefill_bucket(rows, length)
    tokens = rows * (length if bucket is None else bucket[1])
    assert tokens <= max(PREFILL_TOKENS, length)
    assert bucket is None or bucket[0] == rows
    if rows * 2 * (length if bucket is None else bucket[1]) <= PREFILL_TOKENS:
        pytest.fail(f"{rows} rows of {length} tokens: twice as many would fit")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_min_new_tokens_is_a_whole_number_of_frames_from_one(bad):
    """EOS drawn from the prompt would leave a row no frame: one frame at least, upstream's 2 by default."""
    with pytest.raises(ValueError, match=r"Generate: min_new_tokens must be an integer >= 1, got .*; use 2"):
        GenerationSettings(min_new_tokens=bad).validate("Generate")
    assert GenerationSettings().min_new_tokens == 2
    assert GenerationSettings(min_new_tokens=1).validate("Generate").min_new_tokens == 1


def test_a_rows_text_table_holds_its_longest_trailing_text_and_the_pad_after_it():
    assert text_slots(255) == 256 and text_slots(256) == 512  # the prompt's tokens and one pad slot
    assert text_slots(0) == MIN_CAPACITY
