"""morph/engine/block_manager.py in host integers: a row's pages are set aside as it joins, taken for its prompt and
then one at each page it reaches, never past its frame limit's page, and all given back as it leaves; an overcommitted
pool admits a share and leaves a page free for every row, and names the rows it has no page for; the null page is never
handed out; the render's pool sizes (settings.pool_pages, requeue_pool_pages) hold what they promise."""

from __future__ import annotations

import random

import pytest

from morph.engine.block_manager import BlockManager
from morph.settings import KV_PAGE, POOL_FRAME_SHARE, pool_pages, requeue_pool_pages


def test_pages_for_counts_the_pages_a_span_of_slots_touches():
    blocks = BlockManager(pages=9, page=4)
    assert [blocks.pages_for(lo, hi) for lo, hi in ((0, 4), (0, 5), (3, 5), (4, 8), (5, 5), (7, 16))] == [1, 2, 2, 1,
                                                                                                          0, 3]


def test_a_row_takes_its_prompts_pages_then_one_at_each_page_it_reaches_and_none_past_its_limit():
    """Page 4 slots; a row whose prompt is slots 2..9 joins at 10 and may write up to slot 21 (page column 5)."""
    blocks = BlockManager(pages=12, page=4)
    assert blocks.admit("a", lo=2, at=10, end=22)
    assert blocks.available == 11 - 6  # columns 0..5 set aside: 6 pages
    first, pages = blocks.take_through("a", 10)  # columns 0, 1, 2 (slot 10 is in column 2)
    assert first == 0 and len(pages) == 3 and 0 not in pages
    grown = {}
    for position in range(10, 40):
        granted, short = blocks.grow(["a"], position)
        assert not short
        for row, page in granted:
            assert position % 4 == 0 and row == "a"
            grown[position // 4] = page
    assert sorted(grown) == [3, 4, 5]  # each column once, none past column 5
    assert len(set(pages) | set(grown.values())) == 6 and blocks.used == 6 and blocks.available == 5
    assert sorted(blocks.release("a")) == sorted(pages + list(grown.values()))
    assert blocks.used == 0 and blocks.available == 11 and blocks.peak == 6


def test_a_pool_admits_only_what_it_can_set_aside_and_keeps_each_rows_pages_its_own():
    blocks = BlockManager(pages=9, page=4)  # pages 1..8
    assert blocks.admit("a", 0, 4, 12)  # columns 0..2
    assert not blocks.admit("b", 0, 4, 24)  # 6 pages, 5 left
    assert blocks.admit("b", 0, 4, 20)  # 5 pages
    assert blocks.available == 0 and not blocks.admit("c", 0, 0, 1)
    with pytest.raises(ValueError):
        blocks.admit("a", 0, 4, 8)  # a row joins once
    a = blocks.take_through("a", 4)[1] + [page for _, page in blocks.grow(["a", "b"], 8)[0] if _ == "a"]
    b = blocks.take_through("b", 4)[1]
    assert not set(a) & set(b)
    blocks.release("a")
    assert blocks.available == 3 and blocks.admit("c", 0, 0, 12)


def test_an_overcommitted_pool_admits_a_share_and_names_the_rows_it_has_no_page_for():
    """Page 16 slots, 6 pages: each row sets aside its prompt's page and a quarter of its frames', while a page stays
    free for every row holding pages; past that they grow into pages no row set aside, until there are none."""
    blocks = BlockManager(pages=7, page=16, overcommit=True)
    for name in ("a", "b"):
        assert blocks.admit(name, lo=0, at=16, end=77, share=0.25)  # slots 0..31 (16 + 1 + 15 of 60 frames): 2 pages
        blocks.take_through(name, 16)
    assert blocks.available == 2 and not blocks.admit("c", 0, 16, 77, 0.25)  # 2 more would leave none for a, b
    assert blocks.grow(["a", "b"], 17) == ([], [])  # not at a page's first slot
    granted, short = blocks.grow(["a", "b"], 32)
    assert [row for row, _ in granted] == ["a", "b"] and short == []
    granted, short = blocks.grow(["a", "b"], 48)
    assert granted == [] and short == ["a", "b"]  # every page is held
    blocks.release("b")
    granted, short = blocks.grow(["a"], 48)  # asked again: the row it had no page for
    assert [row for row, _ in granted] == ["a"] and short == []
    assert blocks.grow(["a"], 48) == ([], [])  # and never twice


def test_rows_moved_down_by_whole_pages_take_the_columns_they_moved_to():
    blocks = BlockManager(pages=9, page=4)
    assert blocks.admit("a", 8, 12, 24)  # columns 2..5
    blocks.take_through("a", 12)  # 2, 3
    blocks.shift(2)  # every slot down by 8: now columns 0..3, the next one 2
    assert blocks.grow(["a"], 16) == ([], [])
    assert len(blocks.grow(["a"], 8)[0]) == 1 and len(blocks.grow(["a"], 12)[0]) == 1
    assert blocks.grow(["a"], 16) == ([], [])  # past its limit's column, which moved to 3


def test_every_page_but_the_null_one_is_handed_out_once():
    blocks = BlockManager(pages=6, page=8)
    assert blocks.admit("a", 0, 32, 40)
    pages = sorted(blocks.take_through("a", 39)[1])
    assert pages == [1, 2, 3, 4, 5] and blocks.peak == 5
    with pytest.raises(ValueError):
        BlockManager(pages=1, page=8)


def test_a_renders_pool_holds_its_widest_rows_reservations_wherever_they_start():
    """settings.pool_pages, what render(continuous=True) sizes its pool by: the `width` rows that need the most slots
    can all be admitted at once (each its need and one slot more, as a row joins), each starting anywhere in a page,
    and the pool is at most an eighth (plus a page) over that, on one of eight sizes an octave (so a kept pool serves
    the next render of about the same size)."""
    rng = random.Random(0)
    for _ in range(200):
        needs = [rng.randint(1, 1200) for _ in range(rng.randint(1, 80))]
        width = rng.randint(1, 80)
        pages = pool_pages(needs, width)
        blocks = BlockManager(pages, KV_PAGE)
        widest = sorted(needs, reverse=True)[:width]
        for i, n in enumerate(widest):
            lo = rng.randrange(KV_PAGE) if i % 2 else KV_PAGE - 1  # the worst start: a page's last slot
            assert blocks.admit(i, lo, lo, lo + n + 1)
        need = 1 + sum(-(-(n + 1) // KV_PAGE) + 1 for n in widest)
        assert need <= pages <= need * 9 // 8 + 1, (need, pages)
        assert pages // (pages & -pages) < 16  # eight sizes an octave: at most four significant bits


def test_a_requeue_pool_holds_its_widest_rows_at_a_share_of_their_frames_and_its_largest_row_whole():
    rows = [(40, 400)] * 10 + [(60, 600)]  # (prompt tokens, frame limit)
    pages = requeue_pool_pages(rows, 4)
    assert pages == pool_pages([60 + int(600 * POOL_FRAME_SHARE) + 1] + [40 + int(400 * POOL_FRAME_SHARE) + 1] * 3, 4)
    assert pages < pool_pages([p + f + 1 for p, f in rows], 4)  # less than the rows' limits
    # one row far longer than the others: the pool still holds it whole, wherever it starts in a page
    lone = requeue_pool_pages([(10, 50)] * 8 + [(30, 4000)], 2)
    assert BlockManager(lone, KV_PAGE).admit("long", KV_PAGE - 1, KV_PAGE - 1 + 30, KV_PAGE - 1 + 30 + 4000 + 2)
