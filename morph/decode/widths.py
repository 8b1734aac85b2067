"""The width a continuous batch's step runs at (morph/decode/slots.py): over its live rows only.

The step runs over the first `bucket` slots, the smallest bucket (a power of two, or the batch's width) that holds
the highest live slot, through a view of the state's first rows (TalkerState.rows, LeanState.rows): one step, one
CUDA graph in the fast modes, per bucket, all captured before the first row joins, since a capture's warm-up runs
the step for real and would write over live rows. Free slots are handed out lowest first, so rows gather at the
bottom; once the live rows fit half the bucket, the rows above the bucket they fit are moved into free slots below
it (`moves`), so a row left alone in a wide batch steps at the cost of a single line. Halving is what it takes to
narrow again, so a join and a row's end cannot make the width flip every frame.
"""

from __future__ import annotations

from typing import Callable, Iterable

from . import runner


def buckets(width: int) -> list[int]:
    """The widths a step runs at: the powers of two below `width`, then `width`."""
    out = [1]
    while out[-1] * 2 < width:
        out.append(out[-1] * 2)
    return out + [width] if width > 1 else out


def bucket_for(sizes: list[int], rows: int) -> int:
    """The smallest bucket of `sizes` that holds `rows` slots."""
    return next(b for b in sizes if b >= rows)


def moves(sizes: list[int], live: Iterable[int], free: list[int]) -> tuple[list[int], list[int]]:
    """(from slots, to slots): the live slots above the smallest bucket that holds them all, each to one of the
    lowest free slots (`free` ascending), which all lie below that bucket."""
    live = sorted(live)
    fits = bucket_for(sizes, len(live))
    movers = [s for s in live if s >= fits]
    return movers, free[:len(movers)]


def build_steps(batch, dtype) -> dict[int, Callable[[], object]]:
    """One frame step per bucket of a ContinuousBatch, each over the state's first `bucket` rows. The state is
    left as a batch starts: no row unfinished, the batch's frame hold set."""
    # the steps hold the batch's parts, never the batch: a batch that its own steps refer to is freed only by the
    # garbage collector, which may run in the middle of a later capture and free graphs of the same pool there
    loop, st, mode, device, width = batch.loop, batch.st, batch.mode, batch.device, batch.width
    seq_groups, cp_sampling, rules, streams = batch.seq_groups, batch.cp_sampling, batch.rules, batch.streams
    full = loop.predictor.lean_state(width, device, dtype)
    sizes = buckets(width)
    if mode in runner.FAST_MODES:
        owner = loop.owner(device, dtype)
        loop.graphs.bind(owner)
        loop.prefills.bind(owner)  # the prefills of the rows that join (morph/decode/prefill_graphs.py)
        # a render replays every bucket's graph in turn: an LRU smaller than that would capture them all again on
        # every render. They share one memory pool, so each one more costs little memory.
        loop.graphs.max_graphs = max(loop.graphs.max_graphs, len(sizes))
    st.unfinished.zero_()
    st.min_new.fill_(batch.hold)
    steps = {}
    for n in sizes:
        rows, pred_state = st.rows(n), full.rows(n)

        def step(kind: str = "lean", rows=rows, pred_state=pred_state):
            layers = loop.predictor.lean_layers(pred_state, kind)
            loop.frame_step(rows, seq_groups, cp_sampling, rules, loop.lean_talker(kind), lambda: layers, kind,
                            streams)

        st.rewind()  # a warm-up writes at the state's indices: each capture starts them in bounds
        if mode not in runner.FAST_MODES:
            steps[n] = step
            continue
        key = ("rows", seq_groups, width, n, st.capacity, dtype, cp_sampling, rules.key, mode)
        steps[n] = runner.fast_step(loop.graphs, key, lambda step=step: step(mode), step, mode,
                                    keep=(st, full, rules, streams))
    return steps
