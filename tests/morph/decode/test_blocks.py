"""morph/decode/blocks.py: pages are set aside as a row joins, taken as it grows, and all given back as it ends; a
reservation the pool cannot hold is refused, and the null page is never handed out; a render's pool
(settings.pool_pages) holds its widest rows' reservations."""

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
    assert 0 not in taken and len(set(taken)) == 2 and blocks.left("a") == 1
    assert blocks.available == 5 and blocks.used == 2  # what is reserved stays set aside
    with pytest.raises(OutOfPages):
        blocks.reserve("b", 6)
    blocks.reserve("b", 5)
    assert blocks.available == 0 and not blocks.can_reserve(1)
    assert blocks.release("a") == taken
    assert blocks.available == 3 and blocks.used == 0 and blocks.peak == 2
    with pytest.raises(KeyError):
        blocks.left("a")


def test_a_row_cannot_take_past_its_reservation_nor_reserve_twice():
    blocks = BlockManager(pages=4, page=16)
    blocks.reserve("a", 1)
    blocks.take("a")
    with pytest.raises(OutOfPages):
        blocks.take("a")
    with pytest.raises(ValueError):
        blocks.reserve("a", 1)


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
