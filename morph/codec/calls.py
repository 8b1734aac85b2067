"""Codec call sizes: cuDNN plans each convolution per input shape and a call launches the same kernels whatever its
size, so calls come in few shapes (powers of two), each of enough row-frames to pay for its launches."""

from __future__ import annotations

# The fewest frames of a row one decode call takes; an ICL reference is primed in pieces of it, so no call is larger
# than a live batch's (morph/memory.py counts such calls).
CHUNK = 16

# Rows join at FIRST_GRID-frame marks and decode FIRST_GRID frames at a time until in step with the LIVE_CHUNK-frame
# marks, then LIVE_CHUNK at a time (a call's host cost sizes a chunk), every live row in the same few calls.
FIRST_GRID = 4
LIVE_CHUNK = CHUNK
# A live batch's rows are streams a client waits on: a row joins at the next frame and its chunks ramp up from
# FIRST_CHUNK frames to LIVE_CHUNK (ramp_size), so its first audio comes a frame or two after it joins.
FIRST_CHUNK = 2
RAMP_SIZES = tuple(1 << k for k in range(LIVE_CHUNK.bit_length()))
# A row's last chunk holds its frames since its last chunk and the `lag` frames the host learns of behind the GPU:
# up to about LIVE_CHUNK + lag, in a call of this size.
LAST_CHUNK = 2 * LIVE_CHUNK


def ramp_size(start: int, done: int) -> int:
    """The frames of a live row's next chunk starting at the batch's frame `start`, `done` frames decoded: the largest
    power of two up to LIVE_CHUNK and to what it has had (FIRST_CHUNK at first) that divides `start`."""
    size = 1 << (min(LIVE_CHUNK, max(FIRST_CHUNK, done)).bit_length() - 1)
    while start % size:
        size //= 2
    return size


# The most row-frames of one live call: in the fast modes each call shape is a CUDA graph that keeps its activations,
# so the widest call sets what they hold.
LIVE_ROW_FRAMES = 256


def call_width(n: int) -> int:
    """The next power of two of n (at least 1): a live call's rows, and a call's frames, come in these sizes."""
    return 1 << (max(1, int(n)) - 1).bit_length()


def live_row_frames(width: int) -> int:
    """The most row-frames of one call for a batch of `width` rows: its widest call of LIVE_CHUNK frames', within
    LIVE_ROW_FRAMES, so that rests of LAST_CHUNK frames split over calls no heavier."""
    return min(LIVE_ROW_FRAMES, call_width(width) * LIVE_CHUNK)


def call_frames(frames: int) -> int:
    """Frames a row in a call covering `frames`: a power of two, at least CHUNK, so rows make few call shapes."""
    return max(CHUNK, call_width(frames))

