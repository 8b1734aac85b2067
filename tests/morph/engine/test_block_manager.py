"""morph/engine/block_manager.py in host integers: a row's pages are set aside as it joins, taken for its prompt and
then one at each page it reaches, never past its frame limit's page, and all given back as it leaves; an overcommitted
pool admits a share and leaves a page free for every row, and names the rows it has no page for; the null page is never
handed out; the render's pool sizes (settings.pool_pages, requeue_pool_pages) hold what they promise."""

from __future__ import annotations

import random

import pytest

from morph.engine.block_manager import BlockManager, OutOfPages, PoolTooSmall
from morph.settings import KV_PAGE, POOL_FRAME_SHARE, pool_pages, requeue_pool_pages


def test_pages_for_counts_the_pages_a_span_of_slots_touches():
    blocks = BlockManager(pages=9, page=4)
    assert [blocks.pages_for(lo, hi) for lo, hi in ((0, 4), (0, 5), (3, 5), (4, 8), (5, 5), (7, 16))] == [1, 2, 2, 1,
                                                                                                          0, 3]


@pytest.mark.parametrize("end", [22, 21])
def test_a_row_takes_its_prompts_pages_then_one_at_each_page_it_reaches_and_none_past_its_limit(end):
    """Page 4 slots; a row whose prompt is slots 6..9 joins at 10 and writes up to slot end - 1, in page column 5
    either way; the pool holds exactly its pages."""
    blocks = BlockManager(pages=6, page=4)
    assert blocks.peak == 0 and blocks.stats() == dict(pages=5, page=4, peak_pages=0)
    assert blocks.admit("a", lo=6, at=10, end=end, share=1.0)
    assert blocks.available == 0  # columns 1..5 set aside: 5 pages
    first, pages = blocks.take_through("a", 10)  # columns 1 and 2 (slot 10 is in column 2)
    assert first == 1 and len(pages) == 2 and 0 not in pages
    grown = {}
    for position in range(10, 40):
        granted, short = blocks.grow(["a"], position)
        assert not short
        for row, page in granted:
            assert position % 4 == 0 and row == "a"
            grown[position // 4] = page
    assert sorted(grown) == [3, 4, 5]  # each column once, none past column 5
    assert len(set(pages) | set(grown.values())) == 5 and blocks.used == 5 and blocks.available == 0
    assert blocks.stats() == dict(pages=5, page=4, peak_pages=5)
    assert sorted(blocks.release("a")) == sorted(pages + list(grown.values()))
    assert blocks.used == 0 and blocks.available == 5 and blocks.peak == 5


def test_a_pool_admits_only_what_it_can_set_aside_and_keeps_each_rows_pages_its_own():
    blocks = BlockManager(pages=9, page=4)  # pages 1..8
    assert blocks.admit("a", 0, 4, 12, 1.0)  # columns 0..2
    assert not blocks.admit("b", 0, 4, 24, 1.0)  # 6 pages, 5 left
    assert blocks.admit("b", 0, 4, 20, 1.0)  # 5 pages
    assert blocks.available == 0 and not blocks.admit("c", 0, 0, 1, 1.0)
    with pytest.raises(ValueError, match="'a' already holds pages"):
        blocks.admit("a", 0, 4, 8, 1.0)  # a row joins once
    a = blocks.take_through("a", 4)[1] + [page for _, page in blocks.grow(["a", "b"], 8)[0] if _ == "a"]
    b = blocks.take_through("b", 4)[1]
    assert not set(a) & set(b)
    blocks.release("a")
    assert blocks.available == 3 and blocks.admit("c", 0, 0, 12, 1.0)


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


def test_an_overcommitted_row_sets_aside_its_prompt_and_a_share_of_its_frames():
    """Page 4: a row with its prompt at slots 0..3 joins at 4 with 45 frames and its EOS slot to come (end 50): a
    quarter of the 45, rounded up, is 12, so slots 0..16, 5 pages, are set aside."""
    blocks = BlockManager(pages=20, page=4, overcommit=True)
    assert blocks.admit("a", 0, 4, 50, 0.25) and blocks.available == 19 - 5


def test_a_row_past_its_share_takes_no_page_another_row_set_aside():
    blocks = BlockManager(pages=4, page=4, overcommit=True)  # 3 pages
    assert blocks.admit("a", 0, 0, 40, 0.0)  # slot 0 only: 1 page
    assert blocks.admit("b", 0, 0, 4, 1.0)  # 1 page, one left for the two of them
    blocks.take_through("a", 0)
    assert blocks.grow(["a"], 4)[1] == []  # the page no row set aside
    with pytest.raises(OutOfPages, match="'a' has no reserved page left and every free page is set aside"):
        blocks.take_through("a", 8)  # b's page is b's


def test_grow_serves_every_row_that_reaches_a_page_whatever_the_rows_before_it():
    blocks = BlockManager(pages=9, page=4)
    assert blocks.admit("x", 0, 4, 8, 1.0) and blocks.admit("a", 0, 4, 16, 1.0)
    blocks.take_through("x", 4)
    blocks.take_through("a", 4)
    granted, short = blocks.grow(["x", "a"], 8)  # x's limit is in column 1: it takes none
    assert [row for row, _ in granted] == ["a"] and short == []


def test_a_pool_needs_a_page_besides_the_null_one():
    assert BlockManager(pages=2, page=8).available == 1
    with pytest.raises(ValueError, match="at least 2 pages"):
        BlockManager(pages=1, page=8)
    assert str(PoolTooSmall()) == ("morph: a row needs more key/value cache pages than the whole pool holds; give the "
                                   "continuous batch more pages")


def test_rows_moved_down_by_whole_pages_take_the_columns_they_moved_to():
    blocks = BlockManager(pages=9, page=4)
    assert blocks.admit("a", 8, 12, 28, 1.0)  # columns 2..6
    blocks.take_through("a", 12)  # 2, 3
    blocks.shift(1)  # every slot down by 4: now columns 1..5, the next one 3
    assert blocks.grow(["a"], 16) == ([], [])
    assert len(blocks.grow(["a"], 12)[0]) == 1 and len(blocks.grow(["a"], 16)[0]) == 1
    assert len(blocks.grow(["a"], 20)[0]) == 1
    assert blocks.grow(["a"], 24) == ([], [])  # past its limit's column, which moved to 5


def test_every_page_but_the_null_one_is_handed_out_once():
    blocks = BlockManager(pages=6, page=8)
    assert blocks.admit("a", 0, 32, 40, 1.0)
    pages = sorted(blocks.take_through("a", 39)[1])
    assert pages == [1, 2, 3, 4, 5] and blocks.peak == 5


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
            assert blocks.admit(i, lo, lo, lo + n + 1, 1.0)
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
    assert BlockManager(lone, KV_PAGE).admit("long", KV_PAGE - 1, KV_PAGE - 1 + 30, KV_PAGE - 1 + 30 + 4000 + 2, 1.0)
