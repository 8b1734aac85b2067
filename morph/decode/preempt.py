"""Which row gives way when an overcommitted key/value pool runs short (morph/decode/slots.py ContinuousBatch).

A render whose rows' audio has not gone out overcommits its paged pool (morph/continuous.py, morph/decode/kv_store.py
PagedKV): a row joins once the pages of its prompt and of a share of its frames can be set aside (the most of its limit
any row of the batch has spoken, at least settings.POOL_FRAME_SHARE: rows that run long make the batch admit fewer),
and grows past them into pages no row has set aside. When the rows reach a page that the pool cannot give them all,
the rows that ended give theirs back first; then the row that joined last is preempted (vLLM's preemption by
recompute): its pages freed, it goes back to its source with its stream key to start again from its first frame, so
its take is the one it would have had up to rounding. The oldest row is never preempted, and the pool holds any one
row whole (settings.requeue_pool_pages), so every render ends.
"""

from __future__ import annotations

from typing import Callable

from .blocks import PoolTooSmall


def grow(batch, drain: Callable[[], None], preempted: Callable[[object, int], None]) -> bool:
    """Pages for the slot every live row of `batch` writes next (kv_store's grow); when the pool is short, drain()
    (rows that ended are handed over, never preempted), then the rows that joined last are preempted, each handed
    to preempted(name, stream key), until the rest have theirs. Returns whether a row was preempted."""
    short = batch.kv.grow(batch.live, batch.position)
    if not short:
        return False
    drain()
    short = batch.kv.grow(batch.live, batch.position)
    evicted = False
    while short:
        if len(batch.live) == 1:
            raise PoolTooSmall()
        slot = max(batch.live, key=lambda s: (batch.live[s].start, s))  # joined last
        row = batch.live.pop(slot)
        batch.st.unfinished[slot] = False  # the step pads it with EOS from here, as a cancelled row
        batch.release(slot, row.name)
        batch.preemptions += 1
        evicted = True
        preempted(row.name, row.key)
        short = batch.kv.grow(batch.live, batch.position)
    return evicted
