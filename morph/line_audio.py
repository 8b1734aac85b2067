"""Each line's audio from its rows' (a long text's segments, joined with short pauses), to on_line and on_chunk."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Sequence

import numpy as np

from .lines.line import Row
from .settings import SAMPLE_RATE

SEGMENT_PAUSE_SECONDS = 0.2  # between the segments of a long text
OnAudio = Callable[[int, np.ndarray], None]  # (index into the lines given, float32 24 kHz audio)


def join_with_pauses(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([part for piece in pieces for part in (_pause(), piece)][1:])


def _pause() -> np.ndarray:
    return np.zeros(int(SEGMENT_PAUSE_SECONDS * SAMPLE_RATE), np.float32)


class LineAudio:
    """A render's lines from their rows' audio: whole (`deliver`) and, if `streamed`, as made (`chunks.chunk`)."""

    def __init__(self, rows: Sequence[Row], lines: int, on_line: OnAudio | None, on_chunk: OnAudio | None,
                 streamed: bool):
        self.parts = {i: [None] * n for i, n in Counter(r.index for r in rows).items()}  # each line's segments
        self.results: list[np.ndarray | None] = [None] * lines
        self.on_line = on_line
        self.chunks = LineChunks(rows, on_chunk) if streamed and on_chunk is not None else None
        self.on_whole = on_chunk if self.chunks is None else None  # a line that does not stream: one chunk

    def todo(self, rows: Sequence[Row]) -> list[Row]:
        return [r for r in rows if r.index in self.parts and self.parts[r.index][r.segment] is None]

    def deliver(self, row: Row, wav: np.ndarray) -> None:
        self.parts[row.index][row.segment] = wav
        if self.chunks is not None:
            self.chunks.ended(row)
        if all(part is not None for part in self.parts[row.index]):
            whole = self.results[row.index] = join_with_pauses(self.parts.pop(row.index))
            if self.on_whole is not None:
                self.on_whole(row.index, whole)
            if self.on_line is not None:
                self.on_line(row.index, whole)

    def restart(self, rows: Sequence[Row]) -> bool:
        """Rows to render again (after running out of memory); False if one has handed out chunks (not taken back)."""
        return self.chunks is None or self.chunks.restart(self.todo(rows))


class LineChunks:
    """on_chunk when streamed: a later segment's chunks wait until the one before ends, then follow a pause."""

    def __init__(self, rows: Sequence[Row], on_chunk: OnAudio):
        self.on_chunk = on_chunk
        self.segments = Counter(r.index for r in rows)
        self.current = dict.fromkeys(self.segments, 0)  # line -> the segment whose chunks go out as they come
        self.held: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
        self.over: set[tuple[int, int]] = set()  # (line, segment) of the rows that have ended
        self.out: set[tuple[int, int]] = set()  # ... and of those with chunks handed out

    def chunk(self, row: Row, wav: np.ndarray) -> None:
        if row.segment == self.current[row.index]:
            self._hand(row.index, row.segment, wav)
        else:
            self.held[(row.index, row.segment)].append(wav)

    def ended(self, row: Row) -> None:
        line = row.index
        self.over.add((line, row.segment))
        while (line, self.current[line]) in self.over and self.current[line] + 1 < self.segments[line]:
            self.current[line] += 1
            self.on_chunk(line, _pause())
            for wav in self.held.pop((line, self.current[line]), []):
                self._hand(line, self.current[line], wav)

    def restart(self, rows: Sequence[Row]) -> bool:
        """Rows that had not ended, to render again: their held chunks drop; False if one had handed chunks out."""
        again = [(r.index, r.segment) for r in rows]
        if any(key in self.out for key in again):
            return False
        for key in again:
            self.held.pop(key, None)
        return True

    def _hand(self, line: int, segment: int, wav: np.ndarray) -> None:
        self.out.add((line, segment))
        self.on_chunk(line, wav)
