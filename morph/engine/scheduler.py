"""Who runs in the continuous batch's slots, decided in host integers; the batch turns these decisions into tensors.
A joining row takes the lowest free slots, so rows gather where the narrow steps run. Rows that found no room are
asked for again only after a row ends (a try costs a drain); when an overcommitted pool is short, the row that joined
last starts again and none joins until one ends. The step runs at the smallest bucket holding every live slot; rows
move down once they fit half of it, so a row left alone steps at one line's cost and the width cannot flip per frame."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable

from ..settings import POOL_FRAME_SHARE
from .block_manager import BlockManager, PoolTooSmall

REFILL_DIVISOR = 16  # a render's rows join when width / REFILL_DIVISOR slots are free (or none runs)
FRAME_MS = 80  # a frame's audio plays for 80 ms (12.5 frames a second)
# the share of FRAME_MS a live batch's frame may take: the rest is the margin for joins, codec calls, the host
PACE_PERCENT = 75
PACE_FRAMES = 8  # a width's figure: the mean of its first frames, then an average over about this many
PACE_FORGET = 750  # frames (a minute's audio) after which a width not run since is measured again


@dataclass
class Live:
    """A row in a slot: its name (the caller's), its random stream's key, and the cache slots it spans."""

    name: object
    key: int
    start: int  # the slot of its frame 0
    lo: int  # the slot of its first prompt token
    stop: int  # its frame limit


def buckets(width: int, rows: int | None = None) -> list[int]:
    """The widths a step runs at: the powers of two below `width`, then `width`; over a kept wider state of `rows`,
    its own widths up to the first that holds `width` (their graphs exist)."""
    top = rows or width
    out = [1]
    while out[-1] * 2 < top:
        out.append(out[-1] * 2)
    own = out + [top] if top > 1 else out
    return [b for b in own if b < width] + [bucket_for(own, width)]


def bucket_for(sizes: list[int], rows: int) -> int:
    return next(b for b in sizes if b >= rows)


def moves(sizes: list[int], live: Iterable[int], free: list[int]) -> tuple[list[int], list[int]]:
    """(from slots, to slots): the live slots above the smallest bucket that holds them all, to the lowest free ones."""
    live = sorted(live)
    fits = bucket_for(sizes, len(live))
    movers = [s for s in live if s >= fits]
    return movers, free[:len(movers)]


def fits_batch(key: object, need: int, prompt: int, built: tuple[object, int, int]) -> bool:
    """Whether a row of settings `key`, `need` cache slots and `prompt` tokens at most runs in a batch built for
    `built` (settings, the most slots and prompt tokens a row may take); else it waits for one built for it."""
    return key == built[0] and need <= built[1] and prompt <= built[2]


def has_room(position: int, length: int, needed: int, capacity: int) -> bool:
    """Whether a prompt of `length` slots fits behind the position and `needed` slots after it (its frames, EOS and
    the host's lag) before the capacity; else the live rows move down first."""
    return length <= position and position + needed <= capacity


def back_off(width: int) -> int | None:
    """The width to retry at after running out of memory with `width` rows (half, rounded up); None at one row."""
    return None if width <= 1 else (width + 1) // 2


def fitting_width(width: int, need: Callable[[int], int], free: int) -> int:
    """`width`, backed off until need(width) bytes fit in `free`; one row when none does (its failure names it)."""
    while width > 1 and need(width) > free:
        width = back_off(width)
    return width


class Pace:
    """A live batch's ms a frame by step width, measured as it runs, and whether a width keeps every stream ahead of
    its playback. A width not run for PACE_FORGET frames is forgotten, so a slow spell does not narrow it for good."""

    def __init__(self, budget_ms: float = FRAME_MS * PACE_PERCENT / 100):
        self.budget = budget_ms
        self.ms: dict[int, float] = {}  # step width -> ms a frame
        self._count: dict[int, int] = {}  # step width -> frames averaged, up to PACE_FRAMES
        self._last: dict[int, int] = {}  # step width -> the frame it last ran
        self.frames = 0  # frames measured

    def record(self, width: int, ms: float) -> None:
        """A frame at `width` took `ms` (no join or drain between)."""
        self.frames += 1
        n = self._count[width] = min(self._count.get(width, 0) + 1, PACE_FRAMES)
        old = self.ms.get(width, ms)
        self.ms[width], self._last[width] = old + (ms - old) / n, self.frames
        for w in [w for w, at in self._last.items() if self.frames - at >= PACE_FORGET]:
            del self.ms[w], self._count[w], self._last[w]

    def fits(self, width: int) -> bool:
        """Whether a frame at `width` stays under the budget, by its figure or else the widest narrower one's (launch
        bound, a frame grows slowly with width); yes with none measured."""
        known = [w for w in self.ms if w <= width]
        return not known or self.ms[max(known)] < self.budget


class Scheduler:
    """The slots of one batch of `width` rows; `blocks`: the paged pool (None: dense); `pace`: a live batch's. Rows
    join only at frames on multiples of `grid` (a render's codec calls come in FIRST_GRID-frame chunks)."""

    def __init__(self, width: int, blocks: BlockManager | None = None, pace: Pace | None = None,
                 rows: int | None = None, grid: int = 1):
        self.width, self.blocks, self.pace, self.grid = width, blocks, pace, grid
        self.frame = 0  # frames run; with no row running it moves on to the grid's next mark
        self.live: dict[int, Live] = {}
        self.free = list(range(width))  # ascending: the lowest is handed out first
        self.refill = 1 if pace is not None else max(1, width // REFILL_DIVISOR)
        self.ended = self.preemptions = 0  # rows handed over, rows preempted so far
        # the most of its frame limit a row has spoken in this batch, never under the share its pool was sized for: an
        # overcommitted pool sets that share of a joining row's frames aside (BlockManager.admit)
        self.spoken = POOL_FRAME_SHARE
        self._tried: int | None = None  # rows ended when a join last found no room (None: none waits for room)
        self.buckets = buckets(width, rows)
        self.bucket = self.buckets[-1]  # the step's width: every live slot is below it

    def may_fill(self) -> bool:
        """Whether to ask for rows before this frame."""
        if (self.live and self.frame % self.grid) or (self._tried is not None and self.ended <= self._tried):
            return False
        return bool(self.free) and (not self.live or len(self.free) >= self.refill)

    def filled(self, all_joined: bool) -> None:
        """The runner's answer to may_fill: all waiting rows joined, or one found no room yet."""
        self._tried = None if all_joined else self.ended

    def admit(self, rows: list[tuple[object, int, int]], at: int) -> int:
        """How many of `rows` (name, first prompt slot, frame limit), in order, join at slot `at`: those with a free
        slot whose pages can be set aside, within the pace. PoolTooSmall when the first cannot with no row running."""
        n = 0
        for name, lo, stop in rows[:self._paced(min(len(rows), len(self.free)))]:
            if self.blocks is not None and not self.blocks.admit(name, lo, at, at + stop + 2, self.spoken):
                break
            n += 1
        if n == 0 and rows and not self.live:
            raise PoolTooSmall()
        return n

    def _paced(self, n: int) -> int:
        """How many of n joining rows the pace admits: while the widened step keeps under budget; all where its own
        width is over already (no stream is ahead to keep there); at least one with no row running."""
        if self.pace is None:
            return n
        top, least = max(self.live, default=0), 0 if self.live else 1
        if self.live and not self.pace.fits(bucket_for(self.buckets, top + 1)):
            return n
        while n > least and not self.pace.fits(bucket_for(self.buckets, max(top, self.free[n - 1]) + 1)):
            n -= 1
        return n

    def join(self, rows: list[Live]) -> list[int]:
        """Admitted rows into the lowest free slots; returns their slots."""
        slots, self.free = self.free[:len(rows)], self.free[len(rows):]
        self.live.update(zip(slots, rows))
        return slots

    def take_prompt_pages(self, slots: list[int], at: int) -> list[tuple[int, list[int]]] | None:
        """Per joined slot, its pages through slot `at`: (the first page column, the pages); None for a dense cache."""
        if self.blocks is None:
            return None
        return [self.blocks.take_through(self.live[s].name, at) for s in slots]

    def end(self, slot: int, position: int) -> Live:
        """The row in `slot` ended before slot `position`: its slot and pages back."""
        row = self.live[slot]
        self.spoken = max(self.spoken, min(1.0, (position - row.start) / max(row.stop, 1)))
        self.ended += 1
        return self._leave(slot)

    def preempt(self) -> tuple[int, Live]:
        """The row that joined last gives way: (its slot, the row). PoolTooSmall when it is the only row."""
        if len(self.live) <= 1:
            raise PoolTooSmall()
        slot = max(self.live, key=lambda s: (self.live[s].start, s))
        self.preemptions += 1
        self._tried = self.ended
        return slot, self._leave(slot)

    def _leave(self, slot: int) -> Live:
        row = self.live.pop(slot)
        if self.blocks is not None:
            self.blocks.release(row.name)
        bisect.insort(self.free, slot)
        if not self.live:  # nothing runs on the grid: the next rows join at once
            self.frame = -(-self.frame // self.grid) * self.grid
        return row

    def stepped(self) -> None:
        self.frame += 1

    def grow(self, position: int) -> tuple[list[tuple[int, int]], list[int]]:
        """Pages for slot `position` to the live rows that need one: ([(slot, page)], the slots that found none)."""
        if self.blocks is None:
            return [], []
        slot_of = {row.name: slot for slot, row in self.live.items()}
        granted, short = self.blocks.grow([row.name for row in self.live.values()], position)
        return [(slot_of[name], page) for name, page in granted], [slot_of[name] for name in short]

    def shift(self, shift: int) -> None:
        """Every live row's slots moved down by `shift` (whole pages in a paged pool)."""
        for row in self.live.values():
            row.start -= shift
            row.lo -= shift
        if self.blocks is not None:
            self.blocks.shift(shift // self.blocks.page)

    def align(self, shift: int) -> int:
        """The largest move down of at most `shift` slots the cache allows: whole pages in a paged pool."""
        return shift if self.blocks is None else shift - shift % self.blocks.page

    def fit(self) -> None:
        self.bucket = bucket_for(self.buckets, max(self.live) + 1)

    def narrows(self) -> bool:
        return len(self.live) <= self.bucket // 2

    def compact(self) -> tuple[list[int], list[int]]:
        """(from slots, to slots): `moves`, and the step narrows; the runner moves their state."""
        movers, holes = moves(self.buckets, self.live, self.free)
        self.live.update({hole: self.live.pop(s) for s, hole in zip(movers, holes)})
        self.free = sorted(self.free[len(movers):] + movers)
        self.fit()
        return movers, holes

    def stats(self) -> dict:
        return dict(preemptions=self.preemptions, **({} if self.blocks is None else self.blocks.stats()))
