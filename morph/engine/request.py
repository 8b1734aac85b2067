"""A request in the engine: rows, their streams and cache needs, settings, sink, progress; nothing else is kept."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import numpy as np

from ..lines.line import Row
from ..prompts import prompt_tokens, stream_keys
from ..settings import GenerationSettings

WAITING, RUNNING, DONE, FAILED, CANCELLED = "waiting", "running", "done", "failed", "cancelled"


@dataclasses.dataclass(eq=False)
class Request:
    """Rows in the order they run, each with its stream key and prompt tokens. The sink, called on the engine's
    thread: on_row(row, audio or codes) as each row ends; on_chunk(row, audio) as it is made; on_end(None) once all are
    in, or on_end(error) once if it stops short (not after a cancel); restart(rows): whether they may run again."""

    rows: list[Row]
    keys: list[int]
    prompts: list[int]
    settings: GenerationSettings
    on_row: Callable[[Row, object], None]
    on_end: Callable[[BaseException | None], None]
    on_chunk: Callable[[Row, np.ndarray], None] | None = None
    restart: Callable[[Sequence[Row]], bool] = lambda rows: True
    id: int = 0
    status: str = WAITING
    error: BaseException | None = None
    done: set = dataclasses.field(default_factory=set)  # rows whose audio is in

    @functools.cached_property
    def batch_key(self) -> GenerationSettings:
        """The settings its batch must sample with: its own but the per-row ones."""
        return dataclasses.replace(self.settings, seed=None, max_new_tokens=None)

    @functools.cached_property
    def needs(self) -> dict[Row, int]:
        """Each row's cache slots: prompt, frames, EOS."""
        return {r: p + r.limit + 1 for r, p in zip(self.rows, self.prompts, strict=True)}

    @functools.cached_property
    def prompt_bounds(self) -> dict[Row, int]:
        """Each row's prompt tokens at most, which bound its trailing text too."""
        return dict(zip(self.rows, self.prompts, strict=True))

    @property
    def todo(self) -> list[Row]:
        return [r for r in self.rows if r not in self.done]


def rows_request(rows: Sequence[Row], settings: GenerationSettings, count: Callable[[str], int],
                 on_row: Callable[[Row, object], None], on_end: Callable[[BaseException | None], None],
                 on_chunk: Callable[[Row, np.ndarray], None] | None = None,
                 restart: Callable[[Sequence[Row]], bool] = lambda rows: True, in_order: bool = False,
                 id: int = 0) -> Request:
    """Rows as one request: longest first, so the batch never waits on one that joined late, or `in_order` (a server's
    line, whose segments stream in turn); stream keys from the given order; count(text): its tokens."""
    keys = dict(zip(rows, stream_keys(rows, settings.seed), strict=True))
    order = list(rows) if in_order else sorted(rows, key=lambda r: (-r.limit, -len(r.text)))
    return Request(order, [keys[r] for r in order],
                   [prompt_tokens(r.text, r.line.voice, r.line.instruct, count) for r in order], settings,
                   on_row, on_end, on_chunk, restart, id)
