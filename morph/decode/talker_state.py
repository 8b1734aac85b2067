"""The talker loop's static state, written in place, so a CUDA graph captured against it replays at every position."""

from __future__ import annotations

import copy

import torch

from ..settings import capacity_for
from . import lean


# The per-row tensors besides the K/V caches: a row's later steps read the CARRIED ones again; `tokens` and `hidden`
# are only written, for the static loop to read at its end.
CARRIED = ("code0", "past_hidden", "rope_pos", "pads", "start", "stop", "keys", "seen", "unfinished", "text", "frames")
ROW_TENSORS = CARRIED + ("tokens", "hidden")


class TalkerState:
    """Every tensor a frame step reads or writes, allocated once. lean_kv: the continuous batch's state, with the lean
    layers' K/V, else the static loop's, keeping each slot's hidden state for generate; paging (pages, page size): the
    K/V caches are pools mapped by `table`; text_slots: the text a row may read by its own frame index (or capacity)."""

    def __init__(self, loop, batch: int, capacity: int, device: torch.device, dtype: torch.dtype,
                 lean_kv: bool, paging: tuple[int, int] | None = None, text_slots: int | None = None):
        cfg = loop.config
        hidden, vocab, groups = cfg.hidden_size, cfg.vocab_size, cfg.num_code_groups
        self.batch, self.capacity, self.device, self.dtype, self.lean_kv = batch, capacity, device, dtype, lean_kv
        self.paging = paging
        z = dict(device=device)
        with torch.inference_mode(False), torch.no_grad():
            self.k = self.v = self.table = None
            if lean_kv:
                d = loop.stack.dims
                shape = (batch, d.kv_heads, capacity, d.head_dim)
                if paging is not None:
                    pages, page = paging
                    shape = (pages, d.kv_heads, page, d.head_dim)
                    self.table = torch.zeros(batch, capacity // page, dtype=torch.long, **z)  # all at the null page
                self.k = [torch.zeros(shape, dtype=dtype, **z) for _ in range(cfg.num_hidden_layers)]
                self.v = [torch.zeros(shape, dtype=dtype, **z) for _ in range(cfg.num_hidden_layers)]
                self.cos, self.sin = lean.rope_tables(loop.talker.model.rotary_emb, capacity, device, dtype,
                                                      multimodal=True)
            self.groups = torch.arange(groups - 1, **z)
            self.code0 = torch.zeros(batch, dtype=torch.long, **z)
            self.past_hidden = torch.zeros(batch, 1, hidden, dtype=dtype, **z)
            self.step = torch.zeros(1, dtype=torch.long, **z)  # frame index j
            self.cache_pos = torch.zeros(1, dtype=torch.long, **z)  # slot of frame j's talker token
            self.rope_pos = torch.zeros(batch, dtype=torch.long, **z)
            self.pads = torch.zeros(batch, dtype=torch.long, **z)
            self.min_new = torch.zeros(1, dtype=torch.long, **z)
            # per row: the slot of its frame 0, the slot whose token is forced to EOS (its frame limit), and its
            # random stream's key (morph/decode/streams.py; rows of a continuous batch join at any frame)
            self.start = torch.zeros(batch, dtype=torch.long, **z)
            self.stop = torch.zeros(batch, dtype=torch.long, **z)
            self.keys = torch.zeros(batch, dtype=torch.long, **z)
            self.seen = torch.zeros(batch, vocab, dtype=torch.bool, **z)
            self.unfinished = torch.ones(batch, dtype=torch.bool, **z)
            self.any_left = torch.ones((), dtype=torch.bool, **z)
            self.text = torch.zeros(batch, text_slots or capacity, hidden, dtype=dtype, **z)
            self.frames = torch.zeros(batch, capacity, groups, dtype=torch.long, **z)
            self.tokens = torch.zeros(batch, capacity, dtype=torch.long, **z)
            self.hidden = None if lean_kv else torch.zeros(batch, capacity, hidden, dtype=dtype, **z)

    def rewind(self) -> None:
        """Every index to slot 0: a capture's warm-up runs the step, and stale indices could write past the end."""
        for t in (self.step, self.cache_pos, self.rope_pos, self.pads):
            t.zero_()

    def advance(self) -> None:
        """Every row one slot on, after a frame step; a free slot's rotary position stays inside the tables."""
        for t in (self.step, self.cache_pos, self.rope_pos):
            t.add_(1)
        if self.lean_kv:
            self.rope_pos.clamp_(max=self.cos.shape[0] - 1)

    def rows(self, n: int) -> "TalkerState":
        """The first n rows as a state of batch n: views of the row tensors, the very same shared ones."""
        if n == self.batch:
            return self
        view = copy.copy(self)
        view.batch = n
        for name in ROW_TENSORS:
            t = getattr(self, name)
            setattr(view, name, None if t is None else t[:n])
        if self.table is not None:  # the pools are every row's: only the table is per row
            view.table = self.table[:n]
        elif self.lean_kv:
            view.k, view.v = [t[:n] for t in self.k], [t[:n] for t in self.v]
        return view

    def text_at(self, own: torch.Tensor) -> torch.Tensor:
        """Each row's text hidden state [batch, 1, H] at its own frame index own [batch], clamped in bounds."""
        at = own.clamp(0, self.text.shape[1] - 1).view(-1, 1, 1).expand(-1, 1, self.text.shape[2])
        return self.text.gather(1, at)

    def put_text(self, rows, text: torch.Tensor, pad: torch.Tensor) -> None:
        """`rows` read text [n, T, H] from their frame 0 on, then pad [1, 1, H] (upstream's trailing text, tts_pad)."""
        n = min(text.shape[1], self.text.shape[1])
        self.text[rows] = pad.reshape(1, 1, -1)
        self.text[rows, :n] = text[:, :n]

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor, kv_slots: slice) -> None:
        """Rows src into rows dst (disjoint index tensors) as far as later steps read them: the CARRIED tensors, and
        the K/V caches over kv_slots (the rest is masked or written first)."""
        for name in CARRIED:
            t = getattr(self, name)
            t[dst] = t[src]
        # the rows left are free: a wider step steps them as finished rows until a row joins there
        self.unfinished.index_fill_(0, src, False)  # not `[src] = False`, a host sync (batch.py _join)
        if self.table is not None:  # their pages go with them; the rows they leave point at the null page again
            self.table[dst] = self.table[src]
            self.table.index_fill_(0, src, 0)
            return
        for cache in self.k + self.v:
            cache[dst, :, kv_slots] = cache[src, :, kv_slots]

    def matches(self, batch: int, needed: int, device, dtype, lean_kv: bool, paging=None, text_slots=None) -> bool:
        """Whether this state serves a call of these shapes: the continuous batch's any it holds, so the shapes made
        ready at load stay the only ones; the static loop's its own batch and about its capacity."""
        if (self.device, self.dtype, self.lean_kv) != (device, dtype, lean_kv) or not _pool_fits(self.paging, paging):
            return False
        if lean_kv:
            return batch <= self.batch and needed <= self.capacity and (text_slots or needed) <= self.text.shape[1]
        return (self.batch == batch and needed <= self.capacity <= 2 * capacity_for(needed)
                and self.text.shape[1] == (text_slots or self.capacity))


def _pool_fits(have: tuple[int, int] | None, want: tuple[int, int] | None) -> bool:
    """A kept pool serves a batch that wants no more pages of its size; a dense cache, a dense one."""
    if have is None or want is None:
        return have == want
    return have[1] == want[1] and want[0] <= have[0]


