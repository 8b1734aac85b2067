"""The pages of a paged key/value cache: which are free, which row holds which, and what each row may still take.

The continuous batch's talker keys and values live in a pool of pages of `page` slots (morph/decode/talker_state.py,
paged); a row's page table maps its slots to pages (morph/decode/paged.py). A row takes a page as it grows past one and
gives them all back when it ends or is cancelled, so memory follows the tokens in flight. A row joins once the pages
it is set aside can be (`reserve`): all it could need at most (its prompt and its frame limit), so that it never runs
out half way, or (a pool that is overcommitted: morph/decode/kv_store.py) its prompt's; it takes its pages from that
reservation as it grows, then from the pages no reservation holds, and what it did not use goes back with its pages
when it ends. Page 0 is never handed out: a table's unused entries point at it (it is read only where attention masks
it).
"""

from __future__ import annotations


class OutOfPages(RuntimeError):
    """A reservation the pool cannot hold: the caller waits for a row to end (or the row can never fit)."""


class PoolTooSmall(RuntimeError):
    """A row needs more pages than the whole pool holds: it could never run, however long it waited."""

    def __init__(self):
        super().__init__("morph: a row needs more key/value cache pages than the whole pool holds; give the "
                         "continuous batch more pages")


class BlockManager:
    """Pages 1..pages-1 of a pool (page 0 is the null page), each row's reservation and pages."""

    def __init__(self, pages: int, page: int):
        if pages < 2:
            raise ValueError(f"a paged cache needs at least 2 pages (one is the null page), got {pages}")
        self.page, self.pages = page, pages
        self._free = list(range(pages - 1, 0, -1))  # popped from the end: the lowest page first
        self._reserved: dict[object, int] = {}  # row -> pages it may still take
        self._held: dict[object, list[int]] = {}  # row -> the pages it holds, in slot order
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

    def can_reserve(self, n: int) -> bool:
        return n <= self.available

    # -- a row's life ----------------------------------------------------------------------------
    def reserve(self, row, n: int) -> None:
        """Set n pages aside for `row` (a row that joins); OutOfPages when they are not free."""
        if row in self._reserved:
            raise ValueError(f"{row!r} already holds a reservation")
        if not self.can_reserve(n):
            raise OutOfPages(f"{n} pages asked for, {self.available} free of {self.pages - 1}")
        self._reserved[row] = n
        self._held[row] = []

    def can_take(self, row) -> bool:
        """Whether `row` may take a page now: one of its reservation, or one no reservation holds."""
        return self._reserved[row] > 0 or self.available > 0

    def take(self, row) -> int:
        """One page for `row` (a row that joined), now its own: from its reservation while that lasts, then from the
        pages no reservation holds; OutOfPages when neither has one."""
        if self._reserved[row]:
            self._reserved[row] -= 1
        elif self.available <= 0:
            raise OutOfPages(f"{row!r} has no reserved page left and every free page is set aside")
        page = self._free.pop()
        self._held[row].append(page)
        self.peak = max(self.peak, self.used)
        return page

    def release(self, row) -> list[int]:
        """`row` has ended or was cancelled: its pages and what is left of its reservation are free again; returns
        the pages it held."""
        self._reserved.pop(row)
        held = self._held.pop(row)
        self._free.extend(reversed(held))
        return held
