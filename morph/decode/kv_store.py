"""Where the continuous batch's talker keys and values live: dense (`DenseKV`) or paged (`PagedKV`), a row's slot s at
pool[table[row, s // page], :, s % page]; page 0 is the null page unused entries point at, never read unmasked."""

from __future__ import annotations

import torch

from ..settings import KV_PAGE as PAGE


def to_device(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` as a tensor on `device`, copied from pinned memory without waiting for the device's queue."""
    cuda = torch.device(device).type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=cuda).to(device, non_blocking=cuda)


def pages_for_bytes(loop, dtype: torch.dtype, nbytes: int) -> int:
    """The pages (the null page included) a pool of `nbytes` of the talker's keys and values holds."""
    d, layers = loop.stack.dims, loop.config.num_hidden_layers
    page_bytes = PAGE * 2 * layers * d.kv_heads * d.head_dim * dtype.itemsize
    return max(2, int(nbytes) // page_bytes + 1)


def place(table: torch.Tensor, slots: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages, offsets) [B, T]: where slots `slots` [T] of every row of `table` live, in every layer's pool."""
    pages = table[:, slots // page]
    return pages, (slots % page).expand_as(pages)


def put(pool: torch.Tensor, pages: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> None:
    """x [B, kv_heads, T, D] into the pool at `place`'s pages and offsets."""
    pool[pages, :, offsets] = x.transpose(1, 2)


def gather(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The rows' logical caches [B, kv_heads, L, D] from the pool."""
    b, n = table.shape
    _, heads, page, d = pool.shape
    return pool[table].permute(0, 2, 1, 3, 4).reshape(b, heads, n * page, d)


def prompt_rows(index: list[int], device) -> slice | torch.Tensor:
    """What selects rows `index` of a slice's prefill: a slice where they are adjacent and in order, else indices."""
    lo = index[0]
    return slice(lo, lo + len(index)) if index == list(range(lo, lo + len(index))) else to_device(index, device)


class DenseKV:
    """state.k / state.v [width, kv_heads, capacity, D] per layer: every row holds the whole capacity."""

    def __init__(self, st):
        self.st = st

    def write_prompt(self, slots: list[int], kv: list, index: list[int], at: int, length: int, pages: None) -> None:
        """Rows `index` of kv[layer] = (k, v) [m, kv_heads, L, D] into the joining slots at at - length .. at - 1."""
        rows, sel = to_device(slots, self.st.device), prompt_rows(index, self.st.device)
        for (k, v), kc, vc in zip(kv, self.st.k, self.st.v, strict=True):
            kc[rows, :, at - length:at] = k[sel]
            vc[rows, :, at - length:at] = v[sel]

    def grow(self, granted: list, position: int) -> None:
        pass

    def free(self, slot: int) -> None:
        pass

    def shift(self, shift: int, position: int) -> None:
        used = slice(shift, position)
        for kc, vc in zip(self.st.k, self.st.v, strict=True):
            kc[:, :, :position - shift] = kc[:, :, used].clone()
            vc[:, :, :position - shift] = vc[:, :, used].clone()


class PagedKV:
    """state.k / state.v pools [pages, kv_heads, page, D] per layer, state.table [width, capacity / page] into them."""

    def __init__(self, st):
        self.st, self.page = st, st.paging[1]

    def write_prompt(self, slots: list[int], kv: list, index: list[int], at: int, length: int,
                     pages: list[tuple[int, list[int]]]) -> None:
        """DenseKV's, with each joining row's pages (pages[i]: its first column, its pages) into its table first."""
        for slot, (first, held) in zip(slots, pages, strict=True):
            if held:
                self.st.table[slot, first:first + len(held)] = to_device(held, self.st.device)
        rows, where = to_device(slots, self.st.device), torch.arange(at - length, at, device=self.st.device)
        # placed once for all layers, as per layer it costs several one-frame clones; slots before a row's pages: page 0
        places, offsets = place(self.st.table[rows], where, self.page)
        sel = prompt_rows(index, self.st.device)
        for (k, v), kc, vc in zip(kv, self.st.k, self.st.v, strict=True):
            put(kc, places, offsets, k[sel])
            put(vc, places, offsets, v[sel])

    def grow(self, granted: list[tuple[int, int]], position: int) -> None:
        """The pages these slots took for slot `position` ([(slot, page)]), in one table write."""
        if granted:
            slots, pages = zip(*granted, strict=True)
            self.st.table[to_device(list(slots), self.st.device), position // self.page] = to_device(list(pages),
                                                                                                    self.st.device)

    def free(self, slot: int) -> None:
        self.st.table[slot] = 0

    def shift(self, shift: int, position: int) -> None:
        """Every row's slots down by `shift` (whole pages): table entries move, not keys and values."""
        n, table = shift // self.page, self.st.table
        table[:, :table.shape[1] - n] = table[:, n:].clone()
        table[:, table.shape[1] - n:] = 0
