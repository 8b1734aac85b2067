"""A request in the engine (morph/engine/engine.py): its rows, their random streams and cache needs, its settings,
where its audio goes, and how far it has got. Everything a run of it needs travels with it; the engine keeps nothing
else per request."""

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
    """rows: the lines' rows, in the order they run (a script's longest first); keys: each row's random stream
    (morph/prompts.py stream_keys); prompts: each row's prompt tokens, which with its frame limit and the EOS slot
    size its cache (`needs`). The sink: on_row(row, its whole audio, or its codes when the engine decodes no audio)
    as each row ends; on_chunk(row, audio), when given, as each row's audio is made; on_end(None) once every row is
    in, or on_end(error) once when the request stops short (not after a cancel); restart(rows): whether these rows may
    run again from their start (none of their audio has gone out). All are called on the engine's thread."""

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
        """What the batch that runs it must sample with: its settings but the per-row ones (read at every frame the
        batch has a free slot, so made once)."""
        return dataclasses.replace(self.settings, seed=None, max_new_tokens=None)

    @functools.cached_property
    def needs(self) -> dict[Row, int]:
        """Each row's cache slots: its prompt, its frames and the EOS slot."""
        return {r: p + r.limit + 1 for r, p in zip(self.rows, self.prompts, strict=True)}

    @property
    def todo(self) -> list[Row]:
        """Its rows whose audio is not in."""
        return [r for r in self.rows if r not in self.done]


def rows_request(rows: Sequence[Row], settings: GenerationSettings, count: Callable[[str], int],
                 on_row: Callable[[Row, object], None], on_end: Callable[[BaseException | None], None],
                 on_chunk: Callable[[Row, np.ndarray], None] | None = None,
                 restart: Callable[[Sequence[Row]], bool] = lambda rows: True, in_order: bool = False,
                 id: int = 0) -> Request:
    """Rows as one request to the engine, the sink and id as Request takes them: a render's longest first (a row that
    runs longest starts first, so the batch never waits on one that joined late), or `in_order` (a server's line,
    whose segments stream in turn); each row's random stream as the rows were given (morph/prompts.py stream_keys);
    count(text): its tokens, for each row's prompt."""
    keys = dict(zip(rows, stream_keys(rows, settings.seed), strict=True))
    order = list(rows) if in_order else sorted(rows, key=lambda r: (-r.limit, -len(r.text)))
    return Request(order, [keys[r] for r in order],
                   [prompt_tokens(r.text, r.line.voice, r.line.instruct, count) for r in order], settings,
                   on_row, on_end, on_chunk, restart, id)
