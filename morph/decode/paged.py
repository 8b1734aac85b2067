"""A paged key/value cache in torch (modes lean and graphs; morph/kernels/layers.py's paged attention is the fused
mode's): per layer a pool [pages, kv_heads, page, D]; a row's logical slot s lives at pool[table[row, s // page], :,
s % page] (morph/engine/block_manager.py hands the pages out; page 0 is the null page that unused entries point at)."""

from __future__ import annotations

import torch


def write(pool: torch.Tensor, table: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """x [B, kv_heads, T, D] into logical slots `slots` [T] of every row (a slot whose page is the null page writes
    there: it is never read unmasked)."""
    put(pool, *place(table, slots, pool.shape[2]), x)


def place(table: torch.Tensor, slots: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages, offsets) [B, T]: where logical slots `slots` [T] of every row of `table` live in a pool of `page`-slot
    pages; the same for every layer's pool."""
    pages = table[:, slots // page]
    return pages, (slots % page).expand_as(pages)


def put(pool: torch.Tensor, pages: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> None:
    """x [B, kv_heads, T, D] into the pool at `place`'s pages and offsets."""
    pool[pages, :, offsets] = x.transpose(1, 2)


def gather(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The rows' logical caches [B, kv_heads, L, D] (L = the table's pages a row x page) from the pool."""
    b, n = table.shape
    _, heads, page, d = pool.shape
    return pool[table].permute(0, 2, 1, 3, 4).reshape(b, heads, n * page, d)
