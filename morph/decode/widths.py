"""The continuous batch's frame steps (morph/engine/batch.py), one per width it runs at (its scheduler's buckets,
morph/engine/scheduler.py): each over the state's first `bucket` rows, through a view of them (TalkerState.rows,
LeanState.rows); one CUDA graph per bucket in the fast modes, all captured before the first row joins, since a
capture's warm-up runs the step for real and would write over live rows.
"""

from __future__ import annotations

from typing import Callable

from . import runner


def build_steps(batch, dtype, sizes: list[int]) -> dict[int, Callable[[], object]]:
    """One frame step per width in `sizes` of a ContinuousBatch, each over the state's first `width` rows. The state
    is left as a batch starts: no row unfinished, the batch's frame hold set."""
    # the steps hold the batch's parts, never the batch: a batch that its own steps refer to is freed only by the
    # garbage collector, which may run in the middle of a later capture and free graphs of the same pool there
    loop, st, mode, device, width = batch.loop, batch.st, batch.mode, batch.device, batch.width
    seq_groups, cp_sampling, rules, streams = batch.seq_groups, batch.cp_sampling, batch.rules, batch.streams
    full = loop.predictor.lean_state(width, device, dtype)
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
