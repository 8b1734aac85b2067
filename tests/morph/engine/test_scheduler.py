"""morph/engine/scheduler.py in host integers, without a model: rows take the lowest free slots, are asked for only when
enough slots are free and, after one found no room, only once a row has ended; admission in order while the pool can
set pages aside; the row that joined last gives way when the pool is short, never the only one; the step runs at the
smallest bucket that holds the live rows and narrows once they fit half of it; out of memory halves the width down to
one row; a live batch asks for rows at every free slot and admits them while its pace (milliseconds a frame by width)
stays under the budget; a row joins a batch built for its settings and cache need, where its prompt and frames fit
around the position. (The moves themselves, and the codes they keep, are tests/morph/test_continuous.py's.)"""

from __future__ import annotations

import pytest

from morph.engine.block_manager import BlockManager, PoolTooSmall
from morph.engine.scheduler import (FRAME_MS, PACE_FORGET, PACE_PERCENT, REFILL_DIVISOR, Live, Pace, Scheduler, back_off,
                                    bucket_for, buckets, fits_batch, fitting_width, has_room, moves)


def joined(sched: Scheduler, names, at: int, stop: int = 10) -> list[int]:
    rows = [(name, at - 2, stop) for name in names]
    n = sched.admit(rows, at)
    return sched.join([Live(name, 0, at, lo, stop) for name, lo, stop in rows[:n]])


def test_a_row_joins_a_batch_built_for_its_settings_and_at_least_its_cache_need_and_prompt():
    built = ("calm", 512, 64)
    assert fits_batch("calm", 512, 64, built) and fits_batch("calm", 1, 1, built)
    assert not fits_batch("calm", 513, 64, built)  # a slot more than a row may take
    assert not fits_batch("calm", 512, 65, built)  # a prompt token more than its text table holds
    assert not fits_batch("bright", 100, 10, built)


def test_a_prompt_joins_at_the_position_only_with_its_slots_behind_it_and_its_frames_ahead():
    assert has_room(position=30, length=30, needed=70, capacity=100)  # both to the slot
    assert not has_room(position=29, length=30, needed=70, capacity=100)  # a prompt slot short behind
    assert not has_room(position=31, length=30, needed=70, capacity=100)  # a frame slot short ahead


def test_rows_take_the_lowest_free_slots_and_give_them_back_as_they_end():
    sched = Scheduler(4)
    assert joined(sched, "abc", at=8) == [0, 1, 2] and sched.free == [3]
    assert sched.end(1, position=12).name == "b"
    assert sched.free == [1, 3] and sched.ended == 1
    assert joined(sched, "d", at=12) == [1]


def test_rows_are_asked_for_when_enough_slots_are_free_and_again_only_after_a_row_ended():
    width = 4 * REFILL_DIVISOR
    sched = Scheduler(width)
    assert sched.may_fill()  # no row runs
    joined(sched, range(width), at=8)
    for slot in range(3):
        sched.end(slot, 12)
        assert sched.may_fill() == (slot + 1 >= 4)  # width / REFILL_DIVISOR free
    sched.filled(all_joined=False)  # one found no room
    assert not sched.may_fill()
    sched.end(5, 13)
    assert sched.may_fill()
    sched.filled(all_joined=True)
    assert sched.may_fill()
    assert Scheduler(3).refill == 1


def test_a_batch_that_has_ended_no_row_asks_again_once_every_row_joined():
    sched = Scheduler(4)
    sched.filled(all_joined=True)
    assert sched.may_fill()
    sched.filled(all_joined=False)
    assert not sched.may_fill()


def test_rows_join_only_on_the_grid_and_with_no_row_running_the_clock_moves_to_its_next_mark():
    sched = Scheduler(2, grid=4)
    assert sched.may_fill()  # frame 0
    joined(sched, "ab", at=8)
    sched.end(0, 9)
    asked = []
    for _ in range(6):
        sched.stepped()
        asked.append((sched.frame, sched.may_fill()))
    assert asked == [(1, False), (2, False), (3, False), (4, True), (5, False), (6, False)]
    sched.end(1, 14)  # the last row leaves at frame 6
    assert sched.frame == 8 and sched.may_fill()
    assert Scheduler(2).grid == 1  # a live batch's rows join at any frame


def test_the_refill_share_rounds_down():
    sched = Scheduler(40)  # 40 / REFILL_DIVISOR: 2 slots
    joined(sched, range(40), at=8)
    sched.end(0, 9)
    assert not sched.may_fill()
    sched.end(1, 9)
    assert sched.may_fill()


def test_admission_stops_at_the_first_row_the_pool_cannot_hold_and_one_that_never_fits_is_refused():
    sched = Scheduler(4, BlockManager(pages=5, page=4))  # 4 pages of 4 slots
    rows = [("a", 0, 2), ("b", 0, 12), ("c", 0, 2)]  # slots 0 .. at + stop + 1
    assert sched.admit(rows, at=4) == 1  # a: slots 0..7, 2 pages; b would need 5
    sched.join([Live("a", 0, 4, 0, 2)])
    assert sched.admit(rows[1:], at=4) == 0  # b blocks c behind it: order is kept
    with pytest.raises(PoolTooSmall):
        Scheduler(4, BlockManager(pages=5, page=4)).admit([("b", 0, 12)], at=4)  # with no row running
    assert Scheduler(2).admit(rows, at=4) == 2  # dense: every row that has a slot
    # a row's pages run to the slot after its EOS slot: at 4 with 6 frames, slots 0..11, 3 pages of 4
    edge = Scheduler(2, BlockManager(pages=4, page=4))
    assert edge.admit([("d", 0, 6)], at=4) == 1 and edge.blocks.available == 0


def test_the_row_that_joined_last_gives_way_and_no_row_joins_until_one_ends():
    sched = Scheduler(4, BlockManager(pages=17, page=4, overcommit=True))
    for name, at in (("old", 4), ("mid", 8), ("new", 8)):
        assert sched.admit([(name, at - 4, 20)], at) == 1
        sched.join([Live(name, 0, at, at - 4, 20)])
        sched.take_prompt_pages([max(sched.live)], at)
    slot, row = sched.preempt()
    assert (slot, row.name) == (2, "new")  # joined last; of two at one slot, the higher
    assert sched.preemptions == 1 and 2 in sched.free and not sched.may_fill()
    assert sched.preempt()[1].name == "mid"
    with pytest.raises(PoolTooSmall):
        sched.preempt()  # the oldest never gives way
    assert sched.stats() == dict(preemptions=2, pages=16, page=4, peak_pages=6)
    sched.end(0, 30)
    assert sched.may_fill() and sched.blocks.used == 0
    # the row that joined last may sit in a lower slot than an older one
    for name, at in (("first", 40), ("second", 44), ("third", 48)):
        sched.admit([(name, at - 4, 20)], at)
        sched.join([Live(name, 0, at, at - 4, 20)])
    sched.end(0, 50)
    sched.admit([("fourth", 48, 20)], 52)
    assert sched.join([Live("fourth", 0, 52, 48, 20)]) == [0]
    slot, row = sched.preempt()
    assert (slot, row.name) == (0, "fourth")
    assert Scheduler(2).stats() == dict(preemptions=0)


def test_grow_names_slots_and_the_pages_they_took():
    sched = Scheduler(2, BlockManager(pages=6, page=4, overcommit=True))  # 5 pages of 4 slots
    for slot, name in enumerate("ab"):
        assert sched.admit([(name, 0, 10)], 4) == 1  # its prompt's page and a quarter of its frames': 2 pages
        sched.join([Live(name, 0, 4, 0, 10)])
        sched.take_prompt_pages([slot], 4)
    assert sched.grow(6) == ([], [])
    granted, short = sched.grow(8)
    assert [s for s, _ in granted] == [0] and short == [1]  # one free page left
    assert Scheduler(2).grow(8) == ([], [])  # dense: nothing to take


@pytest.mark.parametrize("width, expected", [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (64, [1, 2, 4, 8, 16, 32, 64])])
def test_buckets_are_powers_of_two_below_the_width_then_the_width(width, expected):
    assert buckets(width) == expected


def test_the_bucket_for_a_slot_count_is_the_smallest_that_holds_it():
    sizes = buckets(6)
    assert [bucket_for(sizes, n) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]


def test_rows_above_the_bucket_they_fit_move_to_the_lowest_free_slots():
    # three live rows fit 4 slots: the two at 5 and 7 go to the free 0 and 2, the one at 1 stays
    assert moves(buckets(8), {7: "a", 1: "b", 5: "c"}, [0, 2, 3, 4, 6]) == ([5, 7], [0, 2])
    assert moves(buckets(8), [0, 3], [1, 2, 4, 5, 6, 7]) == ([3], [1])
    assert moves(buckets(8), [0, 2], [1, 3, 4, 5, 6, 7]) == ([2], [1])  # the row at slot == bucket moves too
    assert moves(buckets(8), [0, 1], [2, 3, 4, 5, 6, 7]) == ([], [])


def test_the_step_narrows_once_the_live_rows_fit_half_and_the_row_at_the_buckets_edge_moves():
    sched = Scheduler(8)
    assert sched.bucket == 8  # before any row: the whole width
    joined(sched, "abcde", at=8)  # slots 0..4
    sched.fit()
    assert sched.bucket == 8 and not sched.narrows()
    for slot in (0, 1, 3):
        sched.end(slot, 10)
    sched.fit()
    assert sched.bucket == 8 and sched.narrows()  # rows at 2 and 4: fit 2 slots
    movers, holes = sched.compact()
    assert (movers, holes) == ([2, 4], [0, 1]) and sched.bucket == 2
    assert {s: r.name for s, r in sched.live.items()} == {0: "c", 1: "e"} and sched.free == [2, 3, 4, 5, 6, 7]
    sched.end(0, 12)
    sched.fit()
    assert sched.narrows() and sched.compact() == ([1], [0]) and sched.bucket == 1  # the row at slot == bucket


def test_rows_moved_down_keep_their_spans_and_pages():
    sched = Scheduler(2, BlockManager(pages=9, page=4))
    sched.admit([("a", 8, 8)], 12)
    sched.join([Live("a", 0, 12, 8, 8)])
    sched.take_prompt_pages([0], 12)
    assert sched.align(7) == 4 and Scheduler(2).align(7) == 7
    sched.shift(8)
    assert (sched.live[0].start, sched.live[0].lo) == (4, 0)
    assert [s for s, _ in sched.grow(8)[0]] == [0]  # its next column moved with it


def test_a_row_that_speaks_long_raises_the_share_an_overcommitted_pool_sets_aside():
    sched = Scheduler(2)
    joined(sched, "ab", at=4, stop=40)
    assert sched.spoken == 0.25
    sched.end(0, 4 + 10)
    assert sched.spoken == 0.25
    sched.end(1, 4 + 30)
    assert sched.spoken == 0.75
    joined(sched, "cd", at=40, stop=1)
    sched.end(0, 40 + 1)  # a row of one frame that spoke it
    assert sched.spoken == 1.0
    joined(sched, "e", at=50, stop=10)
    sched.end(0, 50 + 14)  # the host learns of an end a few frames late
    assert sched.spoken == 1.0


@pytest.mark.parametrize("width, narrower", [(64, 32), (3, 2), (2, 1), (1, None)])
def test_out_of_memory_halves_the_width_down_to_one_row(width, narrower):
    assert back_off(width) == narrower


@pytest.mark.parametrize("width, free, asked, built", [
    (64, 6400, [64], 64), (64, 6399, [64, 32], 32), (64, 1599, [64, 32, 16, 8], 8), (3, 250, [3, 2], 2),
    (64, 99, [64, 32, 16, 8, 4, 2], 1), (1, 0, [], 1)])
def test_a_batch_is_built_at_the_widest_back_off_its_free_memory_holds_and_one_row_at_least(width, free, asked,
                                                                                              built):
    """Each width asked for once, from the widest down, stopping at the first that fits; one row is never asked."""
    widths = []

    def need(w):  # 100 bytes a row
        widths.append(w)
        return 100 * w

    assert fitting_width(width, need, free) == built and widths == asked


def test_a_pace_averages_each_widths_frames_and_fits_a_width_by_its_own_figure_or_the_widest_narrower_one():
    pace = Pace()
    assert pace.budget == FRAME_MS * PACE_PERCENT // 100 == 60  # ms: a quarter of a frame's playback is the margin
    assert pace.fits(8)  # nothing measured yet
    for ms in (20, 40, 30, 50, 40, 40, 40, 100):
        pace.record(2, ms)
    assert pace.ms == {2: 45}  # the mean of its first PACE_FRAMES frames
    pace.record(2, 5)
    assert pace.ms == {2: 40}  # then an eighth of the way
    pace.record(8, 60)
    assert pace.fits(2) and pace.fits(4) and not pace.fits(8) and not pace.fits(16)  # 4: 2's figure; 16: 8's
    assert pace.fits(1)  # narrower than every width measured
    for _ in range(PACE_FORGET - 1):
        pace.record(2, 40)
    assert not pace.fits(8)
    pace.record(2, 40)
    assert pace.ms == {2: 40} and pace.fits(8)  # 8 has not run for PACE_FORGET frames: it is measured again


def test_a_live_batch_asks_for_rows_whenever_a_slot_is_free():
    width = 4 * REFILL_DIVISOR
    live, render = Scheduler(width, pace=Pace()), Scheduler(width)
    for sched in (live, render):
        joined(sched, range(width), at=8)
        sched.end(3, 12)
    assert live.may_fill() and not render.may_fill()


def test_a_live_batch_admits_rows_while_the_width_they_take_keeps_its_frames_under_the_budget():
    pace = Pace()
    sched = Scheduler(8, BlockManager(pages=40, page=4), pace)
    pace.ms = {2: 40, 4: 70}
    assert joined(sched, "ab", at=8) == [0, 1]  # nothing measured at 2 rows yet
    available = sched.blocks.available
    assert joined(sched, "cde", at=8) == []  # slot 2 or 3 widens the step to 4 rows, which takes 70 ms a frame
    assert sched.blocks.available == available  # and no page was set aside for them
    pace.ms[8] = 65  # slot 4 widens it to 8
    pace.ms[4] = 50
    assert joined(sched, "fgh", at=8) == [2, 3]
    # with no row running the first joins whatever the pace (or none would ever run), the rest as it allows
    slow = Pace()
    slow.ms = {1: 90}
    assert joined(Scheduler(8, pace=slow), "ijk", at=8) == [0]
    assert joined(Scheduler(8, pace=Pace()), "ijk", at=8) == [0, 1, 2]


def test_a_live_batch_whose_own_width_is_over_the_budget_admits_every_row_that_fits():
    """One slow row (100 ms a frame alone): no stream is ahead of playback, so holding rows back would only make them
    wait for it to end; a batch within the budget still holds back a row that would widen it past."""
    pace = Pace()
    sched = Scheduler(8, pace=pace)
    assert joined(sched, "a", at=8) == [0]
    pace.ms = {1: 100, 2: 110}
    assert joined(sched, "bc", at=8) == [1, 2]
    within = Scheduler(8, pace=Pace())
    assert joined(within, "a", at=8) == [0]
    within.pace.ms = {1: 40, 2: 70}
    assert joined(within, "b", at=8) == []
    # the step's own width is its top slot's bucket (slot 2: 4 rows), not a narrower one's
    wide = Scheduler(8, pace=Pace())
    assert joined(wide, "abc", at=8) == [0, 1, 2]
    wide.pace.ms = {1: 40, 4: 100}
    assert joined(wide, "d", at=8) == [3]



def test_a_batch_over_a_wider_kept_state_steps_at_that_states_widths():
    """A render narrower than the state made ready at load runs the state's own widths (their graphs exist): the
    powers of two below its width, then the first of the state's that holds it; its rows take its first slots."""
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert buckets(48, rows=64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(32, rows=64) == [1, 2, 4, 8, 16, 32]
    assert buckets(1, rows=64) == [1]
    assert buckets(3, rows=48) == [1, 2, 4]
    assert buckets(33, rows=48) == [1, 2, 4, 8, 16, 32, 48]
    sched = Scheduler(48, rows=64)
    assert sched.free == list(range(48)) and sched.bucket == 64
