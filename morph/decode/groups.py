"""Rows that join the continuous batch together (morph/decode/slots.py): a group as its prompt was built, its prefill
on the lean layers, and each of its rows waiting for a slot."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from ..settings import PREFILL_ROWS
from .prefill import Prefilled, lean_prefill


@dataclass
class Group:
    """Rows to join together: their prompt as upstream's generate built it (MorphPatch.prompt_of's
    inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed), each row's frame limit and stream key."""

    names: list
    prompt: dict
    stops: list[int]
    keys: list[int]


class GroupPrefill:
    """Up to PREFILL_ROWS rows of a group, their prompts left-padded to the group's `length`: their prefill
    (prefill.py), run when the first of them joins and freed once the last has, their trailing text [m, T, H] and the
    pad [1, 1, H]."""

    def __init__(self, run: Callable[[], Prefilled], text: torch.Tensor, pad: torch.Tensor, length: int):
        self._run, self._out = run, None
        self.text, self.pad, self.length = text, pad, length

    @property
    def out(self) -> Prefilled:
        if self._out is None:
            self._out, self._run = self._run(), None
        return self._out


@dataclass
class Ahead:
    """A row of a group waiting for a slot (its part prefilled as the first of it joins)."""

    shared: GroupPrefill
    index: int  # its row in the prefill
    name: object
    stop: int
    key: int
    pad: int  # left padding of its prompt



def prefill_group(loop, st, group: Group) -> list[Ahead]:
    """A group's prompts through the lean layers (morph/decode/prefill.py: upstream's talker forward without its host
    time), PREFILL_ROWS at a time, each part as its first row joins, with the rotary tables of the batch's state
    `st`; the rows then join from it, a few at a time, as slots free up."""
    p = group.prompt
    embeds, mask, text = p["inputs_embeds"], p["attention_mask"], p["trailing_text_hidden"]
    length = embeds.shape[1]
    pads = (length - mask.sum(-1)).tolist()  # one host sync a group
    pad = p["tts_pad_embed"].reshape(1, 1, -1)
    rows = []
    for lo in range(0, len(group.names), PREFILL_ROWS):
        part = slice(lo, lo + PREFILL_ROWS)
        shared = GroupPrefill(functools.partial(lean_prefill, embeds[part], mask[part], loop.stack.weights(),
                                                loop.talker.model.norm.weight, loop.talker.codec_head.weight, st.cos,
                                                st.sin, loop.stack.dims), text[part], pad, length)
        rows += [Ahead(shared, i, *row) for i, row in enumerate(zip(
            group.names[part], group.stops[part], group.keys[part], pads[part], strict=True))]
    return rows
