"""morph/codec/calls.py in host integers: the most row-frames one call of a batch holds."""

from __future__ import annotations

import pytest

from morph.codec.calls import LAST_CHUNK, LIVE_CHUNK, LIVE_ROW_FRAMES, live_row_frames
from morph.codec.pieces import call_rows


@pytest.mark.parametrize("width, most", [(1, 16), (3, 64), (8, 128), (16, 256), (64, 256)])
def test_no_call_of_a_batch_holds_more_row_frames_than_its_widest_live_chunk_call(width, most):
    """The widest call of LIVE_CHUNK frames (rows padded to a power of two), within LIVE_ROW_FRAMES."""
    assert live_row_frames(width) == most <= LIVE_ROW_FRAMES


def test_eight_rows_rests_go_four_to_a_call_as_heavy_as_their_live_chunks_call():
    assert call_rows(LAST_CHUNK, live_row_frames(8)) == 4 and call_rows(LIVE_CHUNK, live_row_frames(8)) == 8
