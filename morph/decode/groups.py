"""Rows that join the continuous batch together (morph/decode/slots.py): a group as its prompt was built, its prefill
on the lean layers, and each of its rows waiting for a slot."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .prefill import lean_prefill


@dataclass
class Group:
    """Rows to join together: their prompt as upstream's generate built it (MorphPatch.prompt_of's
    inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed), each row's frame limit and stream key."""

    names: list
    prompt: dict
    stops: list[int]
    keys: list[int]


@dataclass
class GroupPrefill:
    """A group's prefill (prefill.py), its trailing text [m, T, H] and pad [1, 1, H], kept until its rows joined."""

    kv: list
    logits: torch.Tensor
    past_hidden: torch.Tensor
    text: torch.Tensor
    pad: torch.Tensor
    length: int


@dataclass
class Ahead:
    """A prefilled row waiting for a slot."""

    shared: GroupPrefill
    index: int  # its row in the prefill
    name: object
    stop: int
    key: int
    pad: int  # left padding of its prompt



def prefill_group(loop, st, group: Group) -> list[Ahead]:
    """A group's prompts through the lean layers at once (morph/decode/prefill.py: upstream's talker forward without
    its host time, about as long for a batch's width of rows as for one), with the rotary tables of the batch's
    state `st`; the rows then join from it, a few at a time, as slots free up."""
    p = group.prompt
    out = lean_prefill(p["inputs_embeds"], p["attention_mask"], loop.stack.weights(), loop.talker.model.norm.weight,
                       loop.talker.codec_head.weight, st.cos, st.sin, loop.stack.dims)
    length = p["inputs_embeds"].shape[1]
    pads = (length - p["attention_mask"].sum(-1)).tolist()  # one host sync a group
    shared = GroupPrefill(out.kv, out.logits, out.past_hidden, p["trailing_text_hidden"],
                          p["tts_pad_embed"].reshape(1, 1, -1), length)
    return [Ahead(shared, i, name, stop, key, pad)
            for i, (name, stop, key, pad) in enumerate(zip(group.names, group.stops, group.keys, pads, strict=True))]
