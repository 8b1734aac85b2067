"""morph/decode/paged.py, the torch twin of the paged cache: a write through a scrambled page table lands where the
table says, and the gathered logical cache is the dense cache those writes would have made."""

from __future__ import annotations

import torch

from morph.decode import paged


def test_writes_through_the_table_read_back_as_the_dense_cache():
    torch.manual_seed(0)
    rows, heads, page, d, pages_a_row = 3, 2, 4, 5, 4  # each row: 16 logical slots
    pool = torch.zeros(1 + rows * pages_a_row, heads, page, d)
    table = (torch.randperm(rows * pages_a_row) + 1).view(rows, pages_a_row)  # every page its own, scrambled
    dense = torch.zeros(rows, heads, pages_a_row * page, d)
    for slots in (torch.arange(0, 7), torch.tensor([7]), torch.tensor([9, 10, 15])):
        x = torch.randn(rows, heads, slots.numel(), d)
        paged.write(pool, table, slots, x)
        dense[:, :, slots] = x
    assert torch.equal(paged.gather(pool, table), dense)
    assert not pool[0].any()  # the null page is written only through table entries that point at it
    b, s = 1, 10
    assert torch.equal(pool[table[b, s // page], :, s % page], dense[b, :, s])
