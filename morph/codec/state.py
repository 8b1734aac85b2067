"""The lean codec's per-row state (morph/codec/layers.py): what a row carries from one chunk to the next."""

from __future__ import annotations

import torch


class CodecState:
    """Each row's left context: one flat row of values a row (`flat`, every slot's [time, channels] in turn), and
    the frames each row has seen (`pos`). Flat, so that rows of several voices' states join in one copy."""

    def __init__(self, flat: torch.Tensor, pos: torch.Tensor, shapes: list[tuple[int, int]]):
        self.flat, self.pos, self.shapes = flat, pos, shapes
        self.slots, start = [], 0
        for t, c in shapes:
            self.slots.append(flat[:, start:start + t * c].view(-1, t, c))
            start += t * c

    def rows(self, start: int, stop: int) -> "CodecState":
        """Rows start..stop as views: decoding them advances these rows of this state."""
        return CodecState(self.flat[start:stop], self.pos[start:stop], self.shapes)

    @staticmethod
    def cat(states: list["CodecState"]) -> "CodecState":
        return CodecState(torch.cat([s.flat for s in states]), torch.cat([s.pos for s in states]), states[0].shapes)


class Cursor:
    """The state's slots in the order the layers use them: each layer takes its context and puts the next."""

    def __init__(self, state: CodecState):
        self.state, self.i = state, 0

    def swap(self, new: torch.Tensor) -> None:
        self.state.slots[self.i].copy_(new)  # in place: `state` may be rows of a larger one
        self.i += 1

    def take(self) -> torch.Tensor:
        return self.state.slots[self.i]
