"""The pages of a paged key/value cache, in host integers: which are free, which row holds which, and which page
columns a row may still take. A row is admitted once its pages can be set aside: all it could need, or in an
overcommitted pool (rows that may start again) its prompt's and a share of its frames' while a page stays free for
every row holding pages. It takes a page as the shared position reaches one of its own, never past its frame limit's,
and gives all back as it ends. Page 0 is never handed out: unused entries point at it, read only under a mask."""

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
    """Pages 1..pages-1 of a pool; each row's reservation, its pages, and the page columns it takes them for."""

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

    def admit(self, row, lo: int, at: int, end: int, share: float) -> bool:
        """Set aside the pages of slots lo .. end-1 for a row joining at `at` (overcommitted: its prompt's and `share`
        of its frames'); False when they are not free now."""
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
        """The row's pages through slot `position`: (the first column they are for, the pages in column order)."""
        first, last = self._next[row], position // self.page
        pages = [self._take(row) for _ in range(first, last + 1)]
        self._next[row] = last + 1
        return first, pages

    def grow(self, rows: Iterable, position: int) -> tuple[list[tuple[object, int]], list]:
        """A page for slot `position` to each row reaching a page of its own: ([(row, page)], rows that found none).
        A row past its limit's page writes the null page; asked again, only the short rows are served."""
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
        """Free the row's pages and what is left of its reservation; returns the pages it held."""
        self._reserved.pop(row)
        del self._next[row], self._last[row]
        held = self._held.pop(row)
        self._free.extend(reversed(held))
        return held

    def shift(self, columns: int) -> None:
        """Every row's slots moved down by `columns` whole pages."""
        for row in self._next:
            self._next[row] -= columns
            self._last[row] -= columns

    def _can_take(self, row) -> bool:
        return self._reserved[row] > 0 or self.available > 0

    def _take(self, row) -> int:
        if self._reserved[row]:
            self._reserved[row] -= 1
        elif self.available <= 0:
            raise OutOfPages(f"{row!r} has no reserved page left and every free page is set aside")
        page = self._free.pop()
        self._held[row].append(page)
        self.peak = max(self.peak, self.used)
        return page
