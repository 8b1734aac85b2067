"""The talker state's text table: each row reads upstream's trailing text by its own frame index, then tts_pad, in a
table that may be smaller than the capacity (the continuous batch's is half of it). What a step then makes of it is
tests/morph/test_exactness.py's (static, against upstream) and tests/morph/test_continuous.py's (rows that join late
and are moved down, against the line alone)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from morph.decode.talker_state import TalkerState

HIDDEN = 4


def state(batch=3, capacity=16, text_slots=None) -> TalkerState:
    config = SimpleNamespace(hidden_size=HIDDEN, vocab_size=8, num_code_groups=4, num_hidden_layers=1)
    return TalkerState(SimpleNamespace(config=config), batch, capacity, torch.device("cpu"), torch.float32,
                       lean_kv=False, text_slots=text_slots)


def text(rows, tokens, first) -> torch.Tensor:
    """[rows, tokens, HIDDEN] whose token t of row r is first + 10 r + t in every lane."""
    values = first + 10 * torch.arange(rows).view(-1, 1) + torch.arange(tokens).view(1, -1)
    return values.float().unsqueeze(-1).expand(-1, -1, HIDDEN)


def test_each_row_reads_its_text_by_its_own_frame_then_the_pad():
    st = state(text_slots=8)
    pad = torch.full((1, 1, HIDDEN), -1.0)
    st.put_text(torch.tensor([0, 2]), text(2, 3, first=100), pad)  # rows 0 and 2, three tokens each
    st.put_text(torch.tensor([1]), text(1, 5, first=500), pad)  # row 1, five tokens
    for own, want in ((0, [100, 500, 110]), (2, [102, 502, 112]), (3, [-1, 503, -1]), (7, [-1, -1, -1])):
        got = st.text_at(torch.full((3,), own))
        assert got.shape == (3, 1, HIDDEN)
        assert got[:, 0, 0].tolist() == want, own


def test_a_row_reads_its_own_frame_wherever_it_started():
    """Rows of a continuous batch start at other slots: the index is the frame, not the slot."""
    st = state(text_slots=8)
    st.put_text(slice(None), text(3, 4, first=0), torch.zeros(1, 1, HIDDEN))
    own = torch.tensor([0, 3, 1])  # e.g. step 5 for rows that started at slots 5, 2 and 4
    assert st.text_at(own)[:, 0, 0].tolist() == [0, 13, 21]


def test_a_slot_no_row_holds_reads_inside_the_table():
    """A free slot's stale start makes its index anything, below zero or past the table: it reads in bounds."""
    st = state(text_slots=4)
    st.put_text(slice(None), text(3, 4, first=0), torch.zeros(1, 1, HIDDEN))
    assert st.text_at(torch.tensor([-7, 2, 40]))[:, 0, 0].tolist() == [0, 12, 23]


def test_text_past_the_table_is_dropped_and_the_table_size_is_part_of_the_match():
    st = state(capacity=16, text_slots=4)
    assert st.text.shape == (3, 4, HIDDEN)
    st.put_text(slice(None), text(3, 9, first=0), torch.zeros(1, 1, HIDDEN))
    assert st.text[0, :, 0].tolist() == [0, 1, 2, 3]
    assert st.matches(3, 16, torch.device("cpu"), torch.float32, False, text_slots=4)
    assert not st.matches(3, 16, torch.device("cpu"), torch.float32, False, text_slots=8)
    assert not st.matches(3, 16, torch.device("cpu"), torch.float32, False)  # the static loop's: the capacity
    assert state(capacity=16).text.shape == (3, 16, HIDDEN)


def test_rows_moved_away_leave_finished_slots_behind():
    """A row moved down (ContinuousBatch._compact) leaves a free slot that a wider step steps again before a row
    joins there: it must step as a finished row, not as the live row it was."""
    st = state(batch=4)
    st.k = st.v = []  # no key/value caches to move in this state
    st.unfinished[:] = torch.tensor([False, True, True, True])
    st.start[:] = torch.tensor([0, 5, 6, 7])
    st.copy_rows(torch.tensor([3]), torch.tensor([0]), slice(0, 4))
    assert st.unfinished.tolist() == [True, True, True, False]
    assert st.start.tolist() == [7, 5, 6, 7]


def test_a_kept_continuous_state_serves_every_batch_it_holds_and_none_it_does_not():
    """The continuous batch's state, made ready at load, serves later renders of fewer rows, slots, pages or text, so
    that their steps replay the graphs captured then; one that needs more of any is a new state."""
    cpu, f32 = torch.device("cpu"), torch.float32
    st = state(batch=4, capacity=64, text_slots=32)
    st.lean_kv, st.paging = True, (100, 32)  # as the continuous batch's paged state (only the match is under test)
    assert st.matches(4, 64, cpu, f32, True, (100, 32), 32)
    assert st.matches(1, 16, cpu, f32, True, (10, 32), 8)  # narrower, shorter, fewer pages, less text
    assert not st.matches(5, 64, cpu, f32, True, (100, 32), 32)  # more rows
    assert not st.matches(4, 128, cpu, f32, True, (100, 32), 32)  # more slots
    assert not st.matches(4, 64, cpu, f32, True, (101, 32), 32)  # more pages
    assert not st.matches(4, 64, cpu, f32, True, (100, 16), 32)  # another page size
    assert not st.matches(4, 64, cpu, f32, True, None, 32)  # a dense cache
    assert not st.matches(4, 64, cpu, f32, True, (100, 32), 33)  # more text
    assert not st.matches(4, 64, cpu, torch.bfloat16, True, (100, 32), 32)
