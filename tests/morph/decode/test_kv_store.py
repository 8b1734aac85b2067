"""morph/decode/kv_store.py: the choice of a joining slice's rows (a view where they are adjacent and in order, the
indices otherwise, a row of the slice cancelled before it joined; both select the same rows), the torch path's
writes and reads through a page table, and to_device on the CPU (tests/gpu/test_continuous.py checks that a copy to
the GPU does not wait)."""

from __future__ import annotations

import pytest
import torch

from morph.decode.kv_store import gather, place, prompt_rows, put, to_device


@pytest.mark.parametrize(("index", "view"), [([0], True), ([2, 3, 4], True), ([1, 3], False), ([3, 2], False)])
def test_a_slices_rows_are_selected_as_a_view_when_adjacent(index, view):
    kv = torch.arange(6 * 2 * 3 * 4).view(6, 2, 3, 4)  # [rows, kv_heads, L, D]
    sel = prompt_rows(index, "cpu")
    assert torch.equal(kv[sel], kv[torch.tensor(index)])
    assert isinstance(sel, slice) == view


def test_writes_through_the_table_read_back_as_the_dense_cache():
    """The torch path's paged cache: a write through a scrambled page table lands where the table says, and the
    gathered logical cache is the dense cache those writes would have made."""
    torch.manual_seed(0)
    rows, heads, page, d, pages_a_row = 3, 2, 4, 5, 4  # each row: 16 logical slots
    pool = torch.zeros(1 + rows * pages_a_row, heads, page, d)
    table = (torch.randperm(rows * pages_a_row) + 1).view(rows, pages_a_row)  # every page its own, scrambled
    dense = torch.zeros(rows, heads, pages_a_row * page, d)
    for slots in (torch.arange(0, 7), torch.tensor([7]), torch.tensor([9, 10, 15])):
        x = torch.randn(rows, heads, slots.numel(), d)
        put(pool, *place(table, slots, page), x)
        dense[:, :, slots] = x
    assert torch.equal(gather(pool, table), dense)
    assert not pool[0].any()  # the null page is written only through table entries that point at it
    b, s = 1, 10
    assert torch.equal(pool[table[b, s // page], :, s % page], dense[b, :, s])


def test_values_arrive_as_the_dtype_asked_for():
    got = to_device([5, 0, 2**32 - 1], "cpu")
    assert got.dtype == torch.long and got.tolist() == [5, 0, 2**32 - 1]
    assert to_device([1, 0], torch.device("cpu"), torch.bool).tolist() == [True, False]
