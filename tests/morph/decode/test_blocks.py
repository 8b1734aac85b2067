"""morph/decode/blocks.py: pages are set aside as a row joins, taken as it grows (past the reservation, only pages no
reservation holds), and all given back as it ends; a reservation the pool cannot hold is refused, and the null page is
never handed out; a render's pool (settings.pool_pages) holds its widest rows' reservations, and one whose rows may be
preempted (settings.requeue_pool_pages) its widest rows at a share of their frames and its largest row whole."""

from __future__ import annotations

import pytest

from morph.decode.blocks import BlockManager, OutOfPages


def test_pages_for_counts_the_pages_a_span_of_slots_touches():
    blocks = BlockManager(pages=9, page=4)
    assert [blocks.pages_for(lo, hi) for lo, hi in ((0, 4), (0, 5), (3, 5), (4, 8), (5, 5), (7, 16))] == [1, 2, 2, 1,
                                                                                                          0, 3]


def test_a_row_takes_from_its_reservation_and_gives_everything_back():
    blocks = BlockManager(pages=9, page=4)  # pages 1..8
    blocks.reserve("a", 3)
    assert blocks.available == 5 and blocks.used == 0
    taken = [blocks.take("a"), blocks.take("a")]
    assert 0 not in taken and len(set(taken)) == 2
    assert blocks.available == 5 and blocks.used == 2  # what is reserved stays set aside
    with pytest.raises(OutOfPages):
        blocks.reserve("b", 6)
    blocks.reserve("b", 5)
    assert blocks.available == 0 and not blocks.can_reserve(1)
    assert blocks.release("a") == taken
    assert blocks.available == 3 and blocks.used == 0 and blocks.peak == 2
    with pytest.raises(KeyError):
        blocks.can_take("a")


def test_past_its_reservation_a_row_takes_only_pages_no_reservation_holds():
    """An overcommitted pool's rows grow into the unreserved pages; none takes a page set aside for another."""
    blocks = BlockManager(pages=5, page=16)  # pages 1..4
    blocks.reserve("a", 1)
    blocks.reserve("b", 2)
    blocks.take("a")
    assert blocks.can_take("a") and blocks.available == 1
    blocks.take("a")  # the one page no reservation holds
    assert not blocks.can_take("a") and blocks.can_take("b")
    with pytest.raises(OutOfPages):
        blocks.take("a")
    assert [blocks.take("b"), blocks.take("b")] and blocks.used == 4 and not blocks.can_take("b")
    blocks.release("b")
    assert blocks.can_take("a") and blocks.available == 2
    with pytest.raises(ValueError):
        blocks.reserve("a", 1)  # a row reserves once


def test_every_page_but_the_null_one_is_handed_out_once():
    blocks = BlockManager(pages=6, page=8)
    blocks.reserve("a", 5)
    pages = sorted(blocks.take("a") for _ in range(5))
    assert pages == [1, 2, 3, 4, 5] and blocks.peak == 5
    with pytest.raises(ValueError):
        BlockManager(pages=1, page=8)


def test_a_renders_pool_holds_its_widest_rows_reservations_wherever_they_start():
    """settings.pool_pages, what render(continuous=True) sizes its pool by: the `width` rows that need the most slots
    can all reserve at once (each its need and one slot more, as a row joins), each starting anywhere in a page, and
    the pool is at most an eighth (plus a page) over that, on one of eight sizes an octave (so a kept pool serves the
    next render of about the same size)."""
    import random

    from morph.settings import KV_PAGE, pool_pages

    rng = random.Random(0)
    for _ in range(200):
        needs = [rng.randint(1, 1200) for _ in range(rng.randint(1, 80))]
        width = rng.randint(1, 80)
        pages = pool_pages(needs, width)
        blocks = BlockManager(pages, KV_PAGE)
        widest = sorted(needs, reverse=True)[:width]
        for i, n in enumerate(widest):
            lo = rng.randrange(KV_PAGE) if i % 2 else KV_PAGE - 1  # the worst start: a page's last slot
            blocks.reserve(i, blocks.pages_for(lo, lo + n + 1))
        need = 1 + sum(-(-(n + 1) // KV_PAGE) + 1 for n in widest)
        assert need <= pages <= need * 9 // 8 + 1, (need, pages)
        assert pages // (pages & -pages) < 16  # eight sizes an octave: at most four significant bits


def test_a_requeue_pool_holds_its_widest_rows_at_a_share_of_their_frames_and_its_largest_row_whole():
    from morph.settings import KV_PAGE, POOL_FRAME_SHARE, pool_pages, requeue_pool_pages

    rows = [(40, 400)] * 10 + [(60, 600)]  # (prompt tokens, frame limit)
    pages = requeue_pool_pages(rows, 4)
    assert pages == pool_pages([60 + int(600 * POOL_FRAME_SHARE) + 1] + [40 + int(400 * POOL_FRAME_SHARE) + 1] * 3, 4)
    assert pages < pool_pages([p + f + 1 for p, f in rows], 4)  # less than the rows' limits
    # one row far longer than the others: the pool still holds it whole, wherever it starts in a page
    lone = requeue_pool_pages([(10, 50)] * 8 + [(30, 4000)], 2)
    blocks = BlockManager(lone, KV_PAGE)
    blocks.reserve("long", blocks.pages_for(KV_PAGE - 1, KV_PAGE - 1 + 30 + 4000 + 2))
