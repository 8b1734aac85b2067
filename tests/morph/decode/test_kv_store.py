"""morph/decode/kv_store.py's choice of a joining slice's rows: a view where they are adjacent and in order, the
indices otherwise (a row of the slice cancelled before it joined); both select the same rows."""

from __future__ import annotations

import pytest
import torch

from morph.decode.kv_store import prompt_rows


@pytest.mark.parametrize(("index", "view"), [([0], True), ([2, 3, 4], True), ([1, 3], False), ([3, 2], False)])
def test_a_slices_rows_are_selected_as_a_view_when_adjacent(index, view):
    kv = torch.arange(6 * 2 * 3 * 4).view(6, 2, 3, 4)  # [rows, kv_heads, L, D]
    sel = prompt_rows(index, "cpu")
    assert torch.equal(kv[sel], kv[torch.tensor(index)])
    assert isinstance(sel, slice) == view
