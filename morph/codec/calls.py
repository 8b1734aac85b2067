"""The codec's call sizes: how many frames of how many rows one decode call takes (morph/codec/layers.py decodes a
call; stream.py and morph/memory.py size them here). cuDNN plans each convolution per input shape, and a
call launches the same ~1,400 kernels whatever its size, so calls come in few shapes (powers of two), each holding
enough row-frames to pay for its launches."""

from __future__ import annotations

# The fewest frames of a row one decode call takes (1.28 s of audio); an ICL reference is primed in pieces of it, so
# that no call is larger than a live batch's (morph/memory.py counts such calls; a 30 s reference in one call would
# be about 0.7 GiB).
CHUNK = 16

# Every layer is causal (morph/codec/layers.py), so a row decodes in chunks of any size as its frames are made, the
# same to rounding; a call's cost (module docstring), paid on the frame loop's host thread, sizes a chunk. So rows
# join at FIRST_GRID-frame marks and a row's first chunk is the FIRST_GRID frames after its first frame, its next ones
# every FIRST_GRID frames until it is in step with the LIVE_CHUNK-frame marks, and from there LIVE_CHUNK frames at a
# time, every live row in the same few calls, their rows padded to a power of two (call_width).
FIRST_GRID = 4
LIVE_CHUNK = CHUNK
# A live batch's (a server's) rows are streams a client waits on: a row joins at the next frame, and its chunks ramp
# up on its own, FIRST_CHUNK frames (1 where it joined at an odd frame), then as many as it has had, up to
# LIVE_CHUNK, each ending on a mark of its size (ramp_size), so that its first audio comes a frame or two after it
# joins whatever the others do, and once it reaches LIVE_CHUNK its chunks share one call with every other row's, as
# a render's do. Every size a power of two: few shapes, each a CUDA graph.
FIRST_CHUNK = 2
RAMP_SIZES = tuple(1 << k for k in range(LIVE_CHUNK.bit_length()))


def ramp_size(start: int, done: int) -> int:
    """The frames of a live row's next chunk, with `done` of its frames decoded and the chunk starting at the batch's
    frame `start`: the largest power of two up to LIVE_CHUNK and to what it has had (FIRST_CHUNK at first) that
    `start` is a multiple of."""
    size = 1 << (min(LIVE_CHUNK, max(FIRST_CHUNK, done)).bit_length() - 1)
    while start % size:
        size //= 2
    return size


# The most row-frames of one live call (16 rows of LIVE_CHUNK frames). In the fast modes each call shape is a CUDA
# graph that keeps its activations (morph/memory.py counts them), so the widest call sets what they hold: 256
# row-frames rather than 512 hold less at the same speed (bench/results/h100-2026-11-26d/NOTES.md).
LIVE_ROW_FRAMES = 256


def call_width(n: int) -> int:
    """The next power of two of n (at least 1): a live call's rows, and a call's frames, come in these sizes."""
    return 1 << (max(1, int(n)) - 1).bit_length()


def call_frames(frames: int) -> int:
    """Frames of each row in a decode call that covers `frames`: a power of two, at least CHUNK, so that a script's
    rows (1 to 15 s) make a few call shapes, not one per length: each new shape slows a render's first run."""
    return max(CHUNK, call_width(frames))

