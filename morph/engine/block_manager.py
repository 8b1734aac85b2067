"""The pages of a paged key/value cache, in host integers: which are free, which row holds which, and which of its
page columns a row may still take.

The continuous batch's talker keys and values live in a pool of pages of `page` slots (morph/decode/talker_state.py,
paged); a row's page table maps its slots to pages (morph/decode/kv_store.py writes and reads
it). All rows share the cache position, so every row reaches a page's first slot at the same step.

A row joins once its pages can be set aside (`admit`): all it could need at most (its prompt and its frame limit), so
it never runs out half way, or, in an overcommitted pool (a render whose rows may start again), its prompt's and a
share of its frames', while that leaves a page free for every row that holds pages. It takes its prompt's pages as it
joins (`take_through`), then one page each time the position reaches a page of its own (`grow`): from its
reservation while that lasts, then from pages no reservation holds, and never past the page of its frame limit. It
gives everything back when it ends, is cancelled or preempted (`release`). Page 0 is never handed out: a table's
unused entries point at it (it is read only where attention masks it).
"""

from __future__ import annotations

import math
from typing import Iterable


class OutOfPages(RuntimeError):
    """A reservation or a page the pool cannot give now."""


class PoolTooSmall(RuntimeError):
    """A row needs more pages than the whole pool holds: it could never run, however long it waited."""

    def __init__(self):
        super().__init__("morph: a row needs more key/value cache pages than the whole pool holds; give the "
                         "continuous batch more pages")


class BlockManager:
    """Pages 1..pages-1 of a pool (page 0 is the null page); each row's reservation, its pages, and the span of page
    columns (page-sized spans of cache slots) it takes them for."""

    def __init__(self, pages: int, page: int, overcommit: bool = False):
        if pages < 2:
            raise ValueError(f"a paged cache needs at least 2 pages (one is the null page), got {pages}")
        self.page, self.pages, self.overcommit = page, pages, overcommit
        self._free = list(range(pages - 1, 0, -1))  # popped from the end: the lowest page first
        self._reserved: dict[object, int] = {}  # row -> pages it may still take from its reservation
        self._held: dict[object, list[int]] = {}  # row -> the pages it holds, in slot order
        self._next: dict[object, int] = {}  # row -> the first column it holds no page for yet
        self._last: dict[object, int] = {}  # row -> the column of its frame limit's slot: it takes no page past it
        self.peak = 0  # the most pages held at once

    # -- how many ------------------------------------------------------------------------------
    def pages_for(self, lo: int, hi: int) -> int:
        """Pages that slots lo .. hi-1 touch."""
        return 0 if hi <= lo else (hi - 1) // self.page - lo // self.page + 1

    @property
    def available(self) -> int:
        """Free pages no reservation has set aside."""
        return len(self._free) - sum(self._reserved.values())

    @property
    def used(self) -> int:
        return self.pages - 1 - len(self._free)

    def stats(self) -> dict:
        return dict(pages=self.pages - 1, page=self.page, peak_pages=self.peak)

    # -- a row's life ----------------------------------------------------------------------------
    def admit(self, row, lo: int, at: int, end: int, share: float) -> bool:
        """Set aside the pages of slots lo .. end-1 for a row that joins at slot `at` (overcommitted: of its prompt and
        `share` of its frames at .. end-1, while a page stays free for every row that holds pages); False when they are
        not free now."""
        if row in self._held:
            raise ValueError(f"{row!r} already holds pages")
        if self.overcommit:
            n = self.pages_for(lo, at + 1 + math.ceil(share * (end - at - 1)))
            if self.available < n + len(self._held):
                return False
        else:
            n = self.pages_for(lo, end)
            if n > self.available:
                return False
        self._reserved[row], self._held[row] = n, []
        self._next[row], self._last[row] = lo // self.page, (end - 1) // self.page
        return True

    def take_through(self, row, position: int) -> tuple[int, list[int]]:
        """The row's pages up to the one holding slot `position` (its prompt's, and the page its first step writes):
        (the first column they are for, the pages in column order)."""
        first, last = self._next[row], position // self.page
        pages = [self._take(row) for _ in range(first, last + 1)]
        self._next[row] = last + 1
        return first, pages

    def grow(self, rows: Iterable, position: int) -> tuple[list[tuple[object, int]], list]:
        """A page for slot `position` to each of `rows` that reaches a page of its own there: ([(row, page)], the rows
        that found none, only in an overcommitted pool). A row past its frame limit's page (ended, not yet handed
        over) writes into the null page instead; asked again, grow serves the rows it found none for and no other
        twice."""
        if position % self.page:
            return [], []
        col, granted, short = position // self.page, [], []
        for row in rows:
            if self._next[row] != col or col > self._last[row]:
                continue
            if not self._can_take(row):
                short.append(row)
                continue
            granted.append((row, self._take(row)))
            self._next[row] = col + 1
        return granted, short

    def release(self, row) -> list[int]:
        """`row` has ended, was cancelled or preempted: its pages and what is left of its reservation are free again;
        returns the pages it held."""
        self._reserved.pop(row)
        del self._next[row], self._last[row]
        held = self._held.pop(row)
        self._free.extend(reversed(held))
        return held

    def shift(self, columns: int) -> None:
        """Every row's slots moved down by `columns` whole pages: its columns with them."""
        for row in self._next:
            self._next[row] -= columns
            self._last[row] -= columns

    # -- one page --------------------------------------------------------------------------------
    def _can_take(self, row) -> bool:
        return self._reserved[row] > 0 or self.available > 0

    def _take(self, row) -> int:
        """One page for `row`, now its own (module docstring)."""
        if self._reserved[row]:
            self._reserved[row] -= 1
        elif self.available <= 0:
            raise OutOfPages(f"{row!r} has no reserved page left and every free page is set aside")
        page = self._free.pop()
        self._held[row].append(page)
        self.peak = max(self.peak, self.used)
        return page
