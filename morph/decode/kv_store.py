"""Where the continuous batch's talker keys and values live (morph/decode/slots.py): dense, each row the whole capacity
of the state (`DenseKV`), or paged, each row the pages it has grown into (`PagedKV`: morph/decode/blocks.py hands them
out, morph/decode/paged.py and the fused kernel read through the page table). The batch asks the same of both: may a
row join (`admit`), its prompt's keys and values into place, pages for the slot every live row writes next (`grow`), a
row's memory back when it ends (`free`), and every row's slots moved down together (`shift`).
"""

from __future__ import annotations

import math

import torch

from ..settings import KV_PAGE as PAGE
from . import paged
from .blocks import BlockManager
from .host import to_device


def pages_for_bytes(loop, dtype: torch.dtype, nbytes: int) -> int:
    """The pages (the null page included) a pool of `nbytes` of the talker's keys and values holds."""
    d, layers = loop.stack.dims, loop.config.num_hidden_layers
    page_bytes = PAGE * 2 * layers * d.kv_heads * d.head_dim * dtype.itemsize
    return max(2, int(nbytes) // page_bytes + 1)


def prompt_rows(index: list[int], device) -> slice | torch.Tensor:
    """What selects rows `index` of a slice's prefill (the rows that join): a slice, no copy, where they are adjacent
    and in order, as they are unless a row was cancelled; else their indices on the device."""
    lo = index[0]
    return slice(lo, lo + len(index)) if index == list(range(lo, lo + len(index))) else to_device(index, device)


class DenseKV:
    """state.k / state.v [width, kv_heads, capacity, D] per layer: every row holds the whole capacity."""

    def __init__(self, st):
        self.st = st

    def admit(self, name, lo: int, at: int, end: int, share: float) -> bool:
        return True

    def write_prompt(self, slots: list[int], kv: list, index: list[int], at: int, length: int, names: list) -> None:
        """The joining rows' (slots) prompt keys and values, kv[layer] = (k, v) [m, kv_heads, L, D] rows `index`,
        into slots at - length .. at - 1."""
        rows, sel = to_device(slots, self.st.device), prompt_rows(index, self.st.device)
        for (k, v), kc, vc in zip(kv, self.st.k, self.st.v, strict=True):
            kc[rows, :, at - length:at] = k[sel]
            vc[rows, :, at - length:at] = v[sel]

    def grow(self, live: dict, position: int) -> list[int]:
        return []

    def free(self, slot: int, name) -> None:
        pass

    def align(self, shift: int) -> int:
        return shift

    def shift(self, shift: int, position: int) -> None:
        used = slice(shift, position)
        for kc, vc in zip(self.st.k, self.st.v, strict=True):
            kc[:, :, :position - shift] = kc[:, :, used].clone()
            vc[:, :, :position - shift] = vc[:, :, used].clone()

    def stats(self) -> dict:
        return {}


class PagedKV:
    """state.k / state.v pools of `pages` pages of `page` slots, state.table [width, capacity / page] (module
    docstring). A row reserves, as it joins, the pages from its first prompt slot to its frame limit; it takes them
    as the batch's position reaches each page, and gives them all back when it ends.

    Overcommitted (a render whose rows may start again, morph/decode/slots.py): a row reserves its prompt's pages and
    a share of its frames', and joins while that leaves a page free for every row that holds pages (all rows reach a
    page's start together); past them it takes pages no reservation holds as it grows, and `grow` names the rows it
    found none for."""

    def __init__(self, st, pages: int, page: int, overcommit: bool = False):
        self.st, self.page, self.overcommit = st, page, overcommit
        self.blocks = BlockManager(pages, page)
        self.next: dict = {}  # name -> the first page-sized span of slots it holds no page for yet
        self.last: dict = {}  # name -> the span of its frame limit's slot: it takes no page past it

    def admit(self, name, lo: int, at: int, end: int, share: float) -> bool:
        """Set aside the pages of slots lo .. end-1 for a row that joins at slot `at` (overcommitted: of its prompt and
        `share` of its frames at..end-1); False when they are not free now."""
        if self.overcommit:
            n = self.blocks.pages_for(lo, at + 1 + math.ceil(share * (end - at - 1)))
            if self.blocks.available < n + len(self.next):
                return False
        else:
            n = self.blocks.pages_for(lo, end)
            if not self.blocks.can_reserve(n):
                return False
        self.blocks.reserve(name, n)
        self.next[name], self.last[name] = lo // self.page, (end - 1) // self.page
        return True

    def write_prompt(self, slots: list[int], kv: list, index: list[int], at: int, length: int, names: list) -> None:
        for slot, name in zip(slots, names, strict=True):
            self._take_to(slot, name, at)  # every page up to slot `at`, which its first step writes
        rows, where = to_device(slots, self.st.device), torch.arange(at - length, at, device=self.st.device)
        # the prompt's slots below a row's first page point at the null page: never read. Placed once for every
        # layer: per layer, the places and the rows' gather took 5.3 ms of a warm one-frame clone, 1.3 since (H100,
        # bench/results/h100-2026-11-27b/NOTES.md)
        pages, offsets = paged.place(self.st.table[rows], where, self.page)
        sel = prompt_rows(index, self.st.device)
        for (k, v), kc, vc in zip(kv, self.st.k, self.st.v, strict=True):
            paged.put(kc, pages, offsets, k[sel])
            paged.put(vc, pages, offsets, v[sel])

    def grow(self, live: dict, position: int) -> list[int]:
        """A page for slot `position` to every live row, when it starts a page (all rows share the position, a
        joining row has its pages up to it, and rows move down by whole pages), in one table write; a row past its
        frame limit, ended and not yet handed over, writes into the null page instead. Returns the live slots that
        found no free page (only in an overcommitted pool): asked again, grow serves them and no other twice."""
        if position % self.page:
            return []
        col, slots, pages, short = position // self.page, [], [], []
        for slot, row in live.items():
            if self.next[row.name] != col or col > self.last[row.name]:
                continue
            if not self.blocks.can_take(row.name):
                short.append(slot)
                continue
            slots.append(slot)
            pages.append(self.blocks.take(row.name))
            self.next[row.name] = col + 1
        if slots:
            self.st.table[to_device(slots, self.st.device), col] = to_device(pages, self.st.device)
        return short

    def free(self, slot: int, name) -> None:
        self.blocks.release(name)
        del self.next[name], self.last[name]
        self.st.table[slot] = 0

    def align(self, shift: int) -> int:
        """Rows move down by whole pages: their table entries move, not their keys and values."""
        return shift - shift % self.page

    def shift(self, shift: int, position: int) -> None:
        n, table = shift // self.page, self.st.table
        table[:, :table.shape[1] - n] = table[:, n:].clone()
        table[:, table.shape[1] - n:] = 0
        for name in self.next:
            self.next[name] -= n
            self.last[name] -= n

    def stats(self) -> dict:
        return dict(pages=self.blocks.pages - 1, page=self.page, peak_pages=self.blocks.peak)

    def _take_to(self, slot: int, name, position: int) -> None:
        """The row's pages up to the one holding slot `position`, into its table row."""
        first, last = self.next[name], position // self.page
        pages = [self.blocks.take(name) for _ in range(first, last + 1)]
        if pages:
            self.st.table[slot, first:last + 1] = to_device(pages, self.st.device)
        self.next[name] = last + 1
