"""The continuous batch's step widths: which buckets there are, which one a set of live slots needs, and which rows
move down to narrow it (the moves themselves, and the codes they keep, are tests/morph/test_continuous.py's)."""

from __future__ import annotations

import pytest

from morph.decode.widths import bucket_for, buckets, moves


@pytest.mark.parametrize("width, expected", [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (64, [1, 2, 4, 8, 16, 32, 64])])
def test_buckets_are_powers_of_two_below_the_width_then_the_width(width, expected):
    assert buckets(width) == expected


def test_the_bucket_for_a_slot_count_is_the_smallest_that_holds_it():
    sizes = buckets(6)
    assert [bucket_for(sizes, n) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]


def test_rows_above_the_bucket_they_fit_move_to_the_lowest_free_slots():
    # three live rows fit 4 slots: the two at 5 and 7 go to the free 0 and 2, the one at 1 stays
    assert moves(buckets(8), {7: "a", 1: "b", 5: "c"}, [0, 2, 3, 4, 6]) == ([5, 7], [0, 2])


def test_rows_already_inside_their_bucket_do_not_move():
    assert moves(buckets(8), [0, 3], [1, 2, 4, 5, 6, 7]) == ([3], [1])
    assert moves(buckets(8), [0, 1], [2, 3, 4, 5, 6, 7]) == ([], [])
