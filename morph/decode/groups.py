"""Rows joining the continuous batch together (engine/batch.py): a group, its prefill by slices, its waiting rows."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import prefill_rows
from .lean import Prefilled
from .runner import FAST_MODES


@dataclass
class Group:
    """Rows to join together: their prompt (prompts.batch_inputs), each row's frame limit, stream key and left padding
    (known on the host: read from the mask, it would wait for the engine's queue)."""

    names: list
    prompt: dict
    stops: list[int]
    keys: list[int]
    pads: list[int]


class Slice:
    """Rows of a group prefilled together when the first of them joins; its outputs live until its rows have joined."""

    def __init__(self, loop, st, prompt: dict, rows: slice, length: int, mode: str):
        self.loop, self.st, self.length, self.mode = loop, st, length, mode
        self.embeds, self.mask = prompt["inputs_embeds"][rows], prompt["attention_mask"][rows]
        self.text = prompt["trailing_text_hidden"][rows]  # [m, T, H]
        self.pad = prompt["tts_pad_embed"].reshape(1, 1, -1)
        self._out: Prefilled | None = None

    def prefilled(self) -> Prefilled:
        if self._out is None:
            self._out = self.loop.prefills.prefill(self.loop, self.embeds, self.mask, (self.st.cos, self.st.sin),
                                                   self.mode in FAST_MODES)
        return self._out


@dataclass
class Ahead:
    """A row waiting for a slot."""

    shared: Slice
    index: int  # its row in the slice
    name: object
    stop: int
    key: int
    pad: int  # left padding of its prompt


def slice_group(loop, st, group: Group, mode: str, most: int | None = None) -> list[Ahead]:
    """A group's rows in join order, in slices of settings.prefill_rows (at most `most`, a live batch's captured rows),
    each prefilled as its first row joins: a whole group's prefill, kept while its rows join, would set the peak."""
    p = group.prompt
    length = p["inputs_embeds"].shape[1]
    per = prefill_rows(length) if most is None else min(prefill_rows(length), most)
    rows = list(zip(group.names, group.stops, group.keys, group.pads, strict=True))
    aheads = []
    for lo in range(0, len(rows), per):
        part = Slice(loop, st, p, slice(lo, lo + per), length, mode)
        aheads += [Ahead(part, i, name, stop, key, pad) for i, (name, stop, key, pad) in enumerate(rows[lo:lo + per])]
    return aheads
