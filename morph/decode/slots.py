"""Continuous batching: a row that ends gives its slot to the next line at once, so no row waits for the longest.

One static state (morph/decode/talker_state.py) of `width` rows, and the one frame step of morph/decode/talker_loop.py
(one CUDA graph for every step in the fast modes). All rows share the cache position P, which the step advances;
a row joins at the current P: upstream's talker forward prefills its prompt (L tokens, left-padded with the rows
that join with it), whose keys and values go into cache slots P-L..P-1 of its row; its lower bound (`pads`) hides
the slots before them from attention, its rotary positions count from its own prompt, its first frame is decoded
at P and its frame limit is the slot `stop`. So the step is the static batch's step, rows only start at other
slots, and the attention kernels skip the blocks below a row's bound.

- Joining costs a prefill, about as long for several rows as for one (a few ms of launches), so rows join in
  groups: when at least `width / REFILL_DIVISOR` slots are free, or no row runs.
- P grows by one a frame. When a joining group would run past the capacity, the pipeline is drained and every
  live row's slots move down by the same amount (to the oldest live row's first slot): positions within a row,
  and so its rotary positions and its attention, stay as they were. The capacity is twice the largest row's need,
  so a move happens at most once per longest line.
- The host reads each row's "unfinished" flag a few frames behind the GPU (as the static loop reads its "rows
  left" flag), so the queue never drains; an ended row's codes are copied out on the device and handed to
  `finished` at once, while the batch goes on.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

import torch

from ..settings import Sampling
from . import runner
from .streams import RowStreams
from .talker_state import TalkerState, cache_tensors

REFILL_DIVISOR = 8  # rows join when width / REFILL_DIVISOR slots are free (or none runs)


@dataclass
class Group:
    """Rows to join together: their prompt as upstream's generate built it (MorphPatch.prompt_of's
    inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed), each row's frame limit and stream key."""

    names: list
    prompt: dict
    stops: list[int]
    keys: list[int]


@dataclass
class _Live:
    name: object
    start: int  # the slot of its frame 0
    lo: int  # the slot of its first prompt token


class ContinuousBatch:
    """Rows of one render decoded `width` at a time in one running batch (module docstring)."""

    def __init__(self, loop, width: int, need: int, options: dict, seq_groups: int, mode: str, device, dtype):
        """need: the most slots one row takes (prompt, frames and the EOS slot); options: the talker's sampling
        keywords, as upstream passes them (MorphPatch.prompt_of)."""
        self.loop, self.width, self.seq_groups, self.device = loop, width, seq_groups, device
        self.mode = runner.resolve(mode, device, loop.lean_check)
        assert self.mode != "eager", "the continuous batch runs the lean layers; eager runs upstream's generate"
        o = options
        self.cp_sampling = Sampling(bool(o["subtalker_dosample"]), float(o["subtalker_temperature"]),
                                    int(o["subtalker_top_k"] or 0), float(o["subtalker_top_p"]))
        self.rules = loop.rules(device, eos_token_id=o.get("eos_token_id") or loop.config.codec_eos_token_id,
                                suppress_tokens=tuple(o.get("suppress_tokens") or ()),
                                repetition_penalty=o["repetition_penalty"], do_sample=o["do_sample"],
                                temperature=o["temperature"], top_k=o["top_k"], top_p=o["top_p"])
        # the prefill's draw is held back too: a row must not end before its first frame
        self.hold = max(int(loop.hold(o["min_new_tokens"])), 1)
        self.st = loop.state(width, 2 * need, device, dtype, lean_kv=True)
        self.streams = loop.row_streams(device)
        self.refill = max(1, width // REFILL_DIVISOR)
        self.position = 0  # P, the host's copy of st.step
        self.live: dict[int, _Live] = {}
        self.free = list(range(width))
        self.ended = 0  # rows handed over so far
        self._step = self._build_step(dtype)

    def _build_step(self, dtype) -> Callable[[], object]:
        loop, st, mode = self.loop, self.st, self.mode
        pred_state = loop.predictor.lean_state(self.width, self.device, dtype)

        def step(kind: str = "lean"):
            layers = loop.predictor.lean_layers(pred_state, kind)
            loop.frame_step(st, self.seq_groups, self.cp_sampling, self.rules, loop.lean_talker(kind), lambda: layers,
                            kind, self.streams)

        st.rewind()
        st.unfinished.zero_()
        st.min_new.fill_(self.hold)
        if mode not in runner.FAST_MODES:
            return step
        loop.graphs.bind(loop.owner(self.device, dtype))
        key = ("rows", self.seq_groups, self.width, st.capacity, dtype, self.cp_sampling, self.rules.key, mode)
        return runner.fast_step(loop.graphs, key, lambda: step(mode), step, mode, keep=(st, pred_state, self.rules, self.streams))

    # -- the host loop ---------------------------------------------------------------------
    def run(self, next_group: Callable[[int], Group | None], finished: Callable[[object, torch.Tensor], None],
            on_step: Callable[[int], None] | None = None) -> None:
        """Decode until next_group(n) (up to n rows, None when there are no more) is spent and every row has
        ended; finished(name, codes [frames, 16], a copy on the device) as each row ends; on_step(live rows)
        before every frame (an exception there stops the batch and propagates)."""
        cuda = self.device.type == "cuda"
        lag = self.loop.sync_lag if cuda else 0
        flags = torch.ones(lag + 2, self.width, dtype=torch.bool, pin_memory=cuda)
        queue: collections.deque = collections.deque()  # (event, flag row, P after the step)
        waiting, spent, frame, tried = None, False, 0, -1
        with torch.inference_mode():
            while True:
                # a group that did not fit is tried again only after a row has ended (each try drains the queue)
                ready = waiting is None or self.ended > tried
                if ready and not spent and self.free and (not self.live or len(self.free) >= self.refill):
                    group = waiting or next_group(len(self.free))
                    waiting = None
                    if group is None:
                        spent = True
                    elif not self._join(group, queue, flags, finished):
                        waiting, tried = group, self.ended
                if not self.live:
                    if spent:
                        self.loop.last_run = dict(mode=self.mode, frames_run=frame, rows=self.ended,
                                                  capacity=self.st.capacity, width=self.width)
                        return
                    continue
                if on_step is not None:
                    on_step(len(self.live))
                self._step()
                self.position += 1
                slot = frame % flags.shape[0]
                flags[slot].copy_(self.st.unfinished, non_blocking=cuda)
                event = None
                if cuda:
                    event = torch.cuda.Event()
                    event.record()
                queue.append((event, slot, self.position))
                frame += 1
                while len(queue) > lag:
                    self._settle(queue.popleft(), flags, finished)

    def _settle(self, entry, flags: torch.Tensor, finished) -> None:
        """Hand over the rows that had ended by this snapshot (those that joined after it are not in it)."""
        event, slot, position = entry
        if event is not None:
            event.synchronize()
        ended = [s for s, row in self.live.items() if row.start < position and not bool(flags[slot, s])]
        for s in ended:
            row = self.live.pop(s)
            finished(row.name, self.st.frames[s, row.start:position].clone())
            self.free.append(s)
            self.ended += 1

    def _drain(self, queue, flags, finished) -> None:
        while queue:
            self._settle(queue.popleft(), flags, finished)

    # -- joining ------------------------------------------------------------------------------
    def _join(self, group: Group, queue, flags, finished) -> bool:
        """Prefill the group into free slots at P; False when it cannot fit behind P or before the capacity yet."""
        st, p = self.st, group.prompt
        embeds, mask = p["inputs_embeds"], p["attention_mask"]
        length, needed = embeds.shape[1], max(group.stops) + 1
        assert len(group.names) <= len(self.free), "next_group returned more rows than slots"
        if self.position < length or self.position + needed > st.capacity:
            self._drain(queue, flags, finished)  # a move needs every pending snapshot read first
            if not self._move_down(length, needed):
                return False
        out = self.loop.prefill(embeds, mask, p["trailing_text_hidden"], p["tts_pad_embed"])
        n, at = len(group.names), self.position
        rows = torch.tensor(self.free[:n], device=self.device)
        pads = length - mask.sum(-1).to(torch.long)
        firsts = [at - length + pad for pad in pads.tolist()]  # each row's first prompt slot
        for (k, v), kc, vc in zip(cache_tensors(out.past_key_values), st.k, st.v):
            kc[rows, :, at - length:at] = k
            vc[rows, :, at - length:at] = v
        keys = torch.tensor(group.keys, dtype=torch.long, device=self.device)
        seen = torch.zeros(n, st.seen.shape[1], dtype=torch.bool, device=self.device)
        first = torch.full((n,), -1, dtype=torch.long, device=self.device)
        token = self.rules.next_token(out.logits[:, -1], seen, first + 1, st.min_new,
                                      noise=self.streams.frame(keys, first))
        seen.scatter_(1, token.unsqueeze(1), True)
        st.pads[rows] = at - length + pads
        st.rope_pos[rows] = length - pads
        st.start[rows] = at
        st.stop[rows] = at + torch.tensor(group.stops, dtype=torch.long, device=self.device)
        st.keys[rows] = keys
        st.seen[rows] = seen
        st.code0[rows] = token
        st.past_hidden[rows] = out.past_hidden
        st.unfinished[rows] = token != self.rules.eos
        st.tokens[rows, at] = token
        text = p["trailing_text_hidden"][:, :st.capacity - at]
        st.text[rows, at:] = p["tts_pad_embed"].reshape(1, 1, -1)
        st.text[rows, at:at + text.shape[1]] = text
        for s, name, lo in zip(self.free[:n], group.names, firsts):
            self.live[s] = _Live(name, at, lo)
        del self.free[:n]
        return True

    def _move_down(self, length: int, needed: int) -> bool:
        """Move every live row's slots down, as far as the oldest live row's first slot allows, so that a prompt of
        `length` fits behind P and `needed` slots after it; False when that is not yet possible."""
        st = self.st
        if not self.live:  # nothing to keep: start again at the prompt's length
            shift = self.position - length
        else:
            shift = min(min(row.lo for row in self.live.values()), self.position - length)
            if shift <= 0:
                return self.position >= length and self.position + needed <= st.capacity
            used = slice(shift, self.position)
            for kc, vc in zip(st.k, st.v):
                kc[:, :, :self.position - shift] = kc[:, :, used].clone()
                vc[:, :, :self.position - shift] = vc[:, :, used].clone()
            for buffer in (st.text, st.frames, st.tokens):
                buffer[:, :st.capacity - shift] = buffer[:, shift:].clone()
            for t in (st.pads, st.start, st.stop):
                t.sub_(shift)
            st.pads.clamp_(min=0)  # rows that ended: their bound only has to stay in the buffer
            for row in self.live.values():
                row.start -= shift
                row.lo -= shift
        self.position -= shift
        st.step.fill_(self.position)
        st.cache_pos.fill_(self.position)
        return self.position + needed <= st.capacity
