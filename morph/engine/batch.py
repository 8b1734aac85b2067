"""Continuous batching: a row that ends gives its slot to the next line at once, so no row waits for the longest. Rows
share the cache position P, which the frame step advances. A row joins at P: its prompt is prefilled into slots
P-L..P-1, its bound `pads` hides the slots below from attention, its rotary positions count from its own prompt and its
frame limit is the slot `stop`. A joining group that would pass the capacity first moves every live row's slots down.
The scheduler decides slots, admission, preemption and width; this module turns them into tensors and runs the frames."""

from __future__ import annotations

import collections
import time
from typing import Callable

import torch

from ..decode import kv_store, runner
from ..decode.groups import Ahead, Group, slice_group
from ..decode.kv_store import to_device
from ..decode.prefill_graphs import LIVE_ROWS
from ..graphs import frame_loop_stream
from ..settings import text_slots
from .block_manager import BlockManager
from .scheduler import Live, Pace, Scheduler, has_room

# A live batch's host runs one frame ahead of the GPU, not the loop's sync_lag: a joining row's prefill queues behind
# the frames already launched, and one frame ahead still keeps the GPU busy (bench/results/h200x2-2026-11-30b).
LIVE_LAG = 1


class ContinuousBatch:
    """Rows of one render decoded `width` at a time in one running batch (module docstring)."""

    def __init__(self, loop, width: int, need: int, prompt: int, options: dict, seq_groups: int, mode: str, device,
                 dtype, pages: int | None = None, overcommit: bool = False, pace: Pace | None = None, grid: int = 1):
        """need, prompt: the most cache slots (prompt, frames, EOS) and prompt tokens one row takes; options: the
        talker's sampling keywords; pages: a paged K/V pool of at least that many pages, else dense; overcommit: the
        pool's rows may be preempted; pace, grid: the Scheduler's."""
        self.loop, self.width, self.seq_groups, self.device = loop, width, seq_groups, device
        # frames behind the GPU the host learns a row ended
        self.lag = 0 if device.type != "cuda" else LIVE_LAG if pace is not None else loop.sync_lag
        self.mode = runner.resolve(mode, device, loop.lean_check)
        assert self.mode != "eager", "the continuous batch runs the lean layers; eager runs upstream's generate"
        self.cp_sampling, self.rules = loop.rules(device, options)
        self.hold = int(options["min_new_tokens"])  # frames before EOS may be drawn, the prefill's draw among them
        paging = None if pages is None else (pages, kv_store.PAGE)
        # a row reads its trailing text by its own frame index, then the pad
        self.st = loop.state(width, 2 * need, device, dtype, lean_kv=True, paging=paging,
                             text_slots=text_slots(prompt))
        self.kv = kv_store.DenseKV(self.st) if pages is None else kv_store.PagedKV(self.st)
        # the state may be a kept wider one (the engine's, made ready at load): rows take the first `width` slots and
        # the step runs at the state's own buckets, whose graphs are captured already
        self.sched = Scheduler(width, None if pages is None else BlockManager(*self.st.paging, overcommit), pace,
                               rows=self.st.batch, grid=grid)
        self.streams = loop.row_streams(device)
        self.position = 0  # P, the host's copy of st.step
        self._paced: float | None = None  # when the last frame was stepped, unless a join or a drain came after it
        self._ahead: list[Ahead] = []  # rows waiting for a slot, in order
        # the steps' "unfinished" flags in a ring of pinned rows, and the steps the host has not read yet
        self._flags = torch.ones(self.lag + 2, self.st.batch, dtype=torch.bool, pin_memory=device.type == "cuda")
        self._queue: collections.deque = collections.deque()
        self._frames = 0  # frames this run
        self.widths: collections.Counter = collections.Counter()  # frames run at each width
        start = time.perf_counter()
        # in inference mode, as run() replays them, whatever the caller's mode: a capture under autograd fails on the
        # inference tensors an earlier call cached (the rules, the row streams) and the render would run op by op
        with torch.inference_mode():
            self._steps = build_steps(self, dtype, self.sched.buckets)
        self.capture_s = time.perf_counter() - start

    @property
    def live(self) -> dict[int, Live]:
        """slot -> the row in it (the scheduler's)."""
        return self.sched.live

    @property
    def ended(self) -> int:
        return self.sched.ended

    def step(self, next_group: Callable[[int], Group | None], finished: Callable[[object, torch.Tensor], None],
             before_frame: Callable[[int], None] | None = None,
             preempted: Callable[[object, int], None] | None = None) -> bool:
        """One frame: rows join, leave and move, then the step. False once every row has ended and next_group(n) (up
        to n rows, None when none waits) has none; the run's figures are then in loop.last_run. finished(name, codes
        [frames, 16] on the device) as a row ends; before_frame(live rows); preempted(name, stream key) as a row gives
        way. The frame's inference mode and stream are left on return: the caller's code runs in its own."""
        with torch.inference_mode(), frame_loop_stream(self.device):
            stepped = self._frame(next_group, finished, before_frame, preempted)
        if stepped:
            self._frames += 1
            return True
        self.loop.last_run = dict(mode=self.mode, seq_groups=self.seq_groups, frames_run=self._frames, rows=self.ended,
                                  capacity=self.st.capacity, width=self.width, widths=dict(sorted(self.widths.items())),
                                  capture_s=round(self.capture_s, 3), **self.sched.stats())
        self._frames, self._paced = 0, None
        self._queue.clear()  # snapshots of rows all handed over: their positions mean nothing to the next run
        return False

    def _frame(self, next_group, finished, before_frame, preempted) -> bool:
        """One frame (step's arguments); False when no row runs and none waits."""
        sched = self.sched
        while True:  # until a frame is stepped
            if sched.may_fill():
                sched.filled(self._fill(next_group, finished))
            if not self.live:
                if not self._ahead:  # next_group was just asked (no row runs, so every slot is free)
                    return False
                continue
            if self._queue and self.position >= max(row.start + row.stop for row in self.live.values()):
                self._drain(finished)  # every row is at its frame limit: a step adds no frame
                continue
            sched.fit()  # no row moves: one that ended but is not yet handed over keeps its slot inside
            if sched.narrows():
                self._drain(finished)  # a row that ended must not be moved as a live one
                if not self.live:
                    continue
                self._compact()
            if before_frame is not None:
                before_frame(len(self.live))
            self._grow(finished, preempted)
            if self.live:  # else every row had ended (handed over as the pool ran short)
                self._step(finished)
                return True

    def _step(self, finished) -> None:
        """The step over the live rows; the rows it ends are handed over `lag` frames later."""
        cuda = self.device.type == "cuda"
        self._steps[self.sched.bucket]()
        self.widths[self.sched.bucket] += 1
        self.sched.stepped()
        self.position += 1
        slot = self.position % self._flags.shape[0]
        self._flags[slot].copy_(self.st.unfinished, non_blocking=cuda)
        event = torch.cuda.current_stream().record_event() if cuda else None
        self._queue.append((event, slot, self.position))
        while len(self._queue) > self.lag:
            self._settle(self._queue.popleft(), finished)
        # frame to frame is the slower of the host and the GPU, with the work between frames
        now, pace = time.perf_counter(), self.sched.pace
        if pace is not None and self._paced is not None:
            pace.record(self.sched.bucket, 1000 * (now - self._paced))
        self._paced = now

    def cancel(self, names) -> None:
        """End these rows early (between frames, on the batch's thread): a live one at the next frame, its codes so far
        handed to `finished`; one waiting for a slot is dropped."""
        self._ahead = [a for a in self._ahead if a.name not in names]
        for s, row in self.live.items():
            if row.name in names:
                self.st.unfinished[s] = False  # the step pads a finished row with EOS and never revives it

    def _settle(self, entry, finished) -> None:
        """Hand over the rows that had ended by this snapshot (those that joined after it are not in it)."""
        event, slot, position = entry
        if event is not None:
            event.synchronize()
        ended = [s for s, row in self.live.items() if row.start < position and not bool(self._flags[slot, s])]
        for s in ended:
            # snapshots come a frame apart, so the row ended at this one's position
            row = self.sched.end(s, position)
            finished(row.name, self.st.frames[s, row.start:position].clone())
            self.kv.free(s)

    def _grow(self, finished, preempted: Callable[[object, int], None]) -> None:
        """Pages for the slot every live row writes next; a short pool drains the queue (ended rows are handed over,
        never preempted), then preempts the rows that joined last until the rest have theirs."""
        if not self._take_pages():
            return
        self._drain(finished)
        while self._take_pages():
            slot, row = self.sched.preempt()
            self.st.unfinished[slot] = False  # the step pads it with EOS from here, as a cancelled row
            self.kv.free(slot)
            preempted(row.name, row.key)

    def _take_pages(self) -> list[int]:
        """Pages for slot P to the live rows that reach a new one; returns the slots that found none."""
        granted, short = self.sched.grow(self.position)
        self.kv.grow(granted, self.position)
        return short

    def _drain(self, finished) -> None:
        self._paced = None  # the frame waits for the GPU's whole queue: no measure of the pace
        while self._queue:
            self._settle(self._queue.popleft(), finished)

    def _compact(self) -> None:
        """Move the live rows down into the smallest bucket that holds them all (after a drain)."""
        movers, holes = self.sched.compact()
        if movers:
            lo = min(self.live[s].lo for s in holes)
            self.st.copy_rows(to_device(movers, self.device), to_device(holes, self.device),
                              slice(lo, self.position))

    def _fill(self, next_group, finished) -> bool:
        """Rows into the free slots, a slice at a time, until either runs out; False when a row cannot fit yet."""
        while self.sched.free:
            if not self._ahead:
                group = next_group(self.width)
                if group is None:
                    return True
                # a live batch's requests that came together join in the slices its engine captured (LIVE_ROWS)
                most = LIVE_ROWS[-1] if self.sched.pace is not None else None
                self._ahead = slice_group(self.loop, self.st, group, self.mode, most)
            if not self._join(finished):
                return False
        return True

    def _join(self, finished) -> bool:
        """The oldest waiting slice's rows into free slots at P; False when they cannot fit yet."""
        st, shared = self.st, self._ahead[0].shared
        rows_in = [a for a in self._ahead if a.shared is shared][:len(self.sched.free)]
        # frames, the EOS slot, and the `lag` frames stepped before the host learns a row ended
        length, needed = shared.length, max(a.stop for a in rows_in) + 1 + self.lag
        if not has_room(self.position, length, needed, st.capacity):
            self._drain(finished)  # a move needs every pending snapshot read first
            if not self._move_down(length, needed):
                return False
        at, dev = self.position, self.device
        rows_in = rows_in[:self.sched.admit([(a.name, at - length + a.pad, a.stop) for a in rows_in], at)]
        if not rows_in:
            return False
        out = shared.prefilled()
        n = len(rows_in)
        slots = self.sched.join([Live(a.name, a.key, at, at - length + a.pad, a.stop) for a in rows_in])
        rows, index = to_device(slots, dev), [a.index for a in rows_in]
        idx = to_device(index, dev)
        self.kv.write_prompt(slots, out.kv, index, at, length, self.sched.take_prompt_pages(slots, at))
        keys = to_device([a.key for a in rows_in], dev)
        pads = to_device([a.pad for a in rows_in], dev)
        seen = torch.zeros(n, st.seen.shape[1], dtype=torch.bool, device=dev)
        first = torch.full((n,), -1, dtype=torch.long, device=dev)
        token = self.rules.next_token(out.logits[idx], seen, first + 1, st.min_new,
                                      noise=self.streams.frame(keys, first))
        seen.scatter_(1, token.unsqueeze(1), True)
        st.pads[rows] = at - length + pads
        st.rope_pos[rows] = length - pads
        st.start.index_fill_(0, rows, at)  # a number set through an index tensor is first copied over: a host sync
        st.stop[rows] = at + to_device([a.stop for a in rows_in], dev)
        st.keys[rows] = keys
        st.seen[rows] = seen
        st.code0[rows] = token
        st.past_hidden[rows] = out.past_hidden[idx]
        st.unfinished[rows] = token != self.rules.eos
        st.tokens[rows, at] = token
        st.put_text(rows, shared.text[idx], shared.pad)
        joined = {id(a) for a in rows_in}
        self._ahead = [a for a in self._ahead if id(a) not in joined]
        self._paced = None  # the prefill is no frame's time
        return True

    def _move_down(self, length: int, needed: int) -> bool:
        """Move every live row's slots down (to the oldest one's first slot at most) so a prompt of `length` fits
        behind P and `needed` slots after it; False when not yet."""
        st = self.st
        if not self.live:  # nothing to keep: start again at the prompt's length
            shift = self.sched.align(self.position - length)
        else:
            shift = self.sched.align(min(min(row.lo for row in self.live.values()), self.position - length))
            if shift <= 0:
                return has_room(self.position, length, needed, st.capacity)
            self.kv.shift(shift, self.position)
            self.sched.shift(shift)
            for buffer in (st.frames, st.tokens):  # the text goes by each row's own frame: it stays
                buffer[:, :st.capacity - shift] = buffer[:, shift:].clone()
            for t in (st.pads, st.start, st.stop):
                t.sub_(shift)
            st.pads.clamp_(min=0)  # rows that ended: their bound only has to stay in the buffer
        self.position -= shift
        st.step.fill_(self.position)
        st.cache_pos.fill_(self.position)
        return has_room(self.position, length, needed, st.capacity)


def build_steps(batch, dtype, sizes: list[int]) -> dict[int, Callable[[], object]]:
    """One frame step per width in `sizes`, over the state's first rows, all captured before any row joins: a
    capture's warm-up runs the step and would write over live rows."""
    # the steps hold the batch's parts, never the batch: a batch that its own steps refer to is freed only by the
    # garbage collector, which may run in the middle of a later capture and free graphs of the same pool there
    loop, st, mode, device, width = batch.loop, batch.st, batch.mode, batch.device, batch.st.batch
    seq_groups, cp_sampling, rules, streams = batch.seq_groups, batch.cp_sampling, batch.rules, batch.streams
    full = loop.predictor.lean_state(width, device, dtype)
    if mode in runner.FAST_MODES:
        owner = loop.owner(device, dtype)
        loop.graphs.bind(owner)
        loop.prefills.bind(owner)  # the prefills of the rows that join (morph/decode/prefill_graphs.py)
        # a render replays every bucket's graph: a smaller LRU would capture them all again each render
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
