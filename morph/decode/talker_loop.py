"""The frame step every mode runs (docs/architecture.md, How morph works), and `TalkerLoop`, which keeps for one model
what it runs on: the lean stack and predictor, the static state, sampling rules, random streams and CUDA graphs."""

from __future__ import annotations

import collections
import functools
from typing import Callable

import torch
import torch.nn.functional as F

from ..settings import Sampling, capacity_for
from .. import graphs
from . import lean
from .fused_stack import FusedStack
from .predictor import Predictor
from .prefill_graphs import PrefillGraphs
from .sampling import TalkerRules, fused_pick, pick, talker_pick, torch_noise
from .streams import RowStreams
from .talker_state import TalkerState


def _samplers(kind: str) -> tuple[Callable, Callable]:
    if kind == "fused":
        return fused_pick, functools.partial(talker_pick, pick_fn=fused_pick)
    return pick, talker_pick


class TalkerLoop:
    def __init__(self, talker: torch.nn.Module, max_graphs: int = 4):
        self.talker, self.config = talker, talker.config
        self.predictor = Predictor(talker.code_predictor)
        self._stack: FusedStack | None = None
        self.graphs = graphs.GraphCache(max_graphs)
        self.prefills = PrefillGraphs()  # the continuous batch's prefills of joining rows
        self._state: TalkerState | None = None
        self._rules: collections.OrderedDict = collections.OrderedDict()
        self.sync_lag = 4  # frames the host may run ahead of the GPU before it reads the EOS flag
        self._streams: tuple[str, RowStreams] | None = None
        self.last_run: dict = {}

    @property
    def stack(self) -> FusedStack:
        if self._stack is None:
            self._stack = FusedStack(self.talker.model.layers, self.talker.model.norm, self.config)
        return self._stack

    def lean_check(self) -> None:
        """Raises LeanUnsupported when the lean layers cannot run this checkpoint."""
        self.stack.dims, self.predictor.stack.dims  # noqa: B018 - reading dims checks the configs

    def drop_state(self) -> None:
        """Forget the kept state and its graphs: a batch that ran out of memory is rebuilt narrower, not beside them."""
        self.graphs.clear()
        self._state = None

    def release(self) -> None:
        """Drop the graphs, buffers and fused weight storage; all rebuilt on the next call."""
        self.graphs.clear()
        self.prefills.clear()
        self._state = None
        self._rules.clear()
        self._streams = None
        graphs.trim_graph_memory()  # first: the weights' copies below may need what the graphs held
        if self._stack is not None:
            self._stack.release()
            self._stack = None
        self.predictor.release()

    def state(self, batch: int, needed: int, device, dtype, lean_kv: bool, paging: tuple[int, int] | None = None,
              text_slots: int | None = None):
        if self._state is None or not self._state.matches(batch, needed, device, dtype, lean_kv, paging, text_slots):
            self.graphs.clear()  # graphs point at the old buffers
            self._state = None
            self._state = TalkerState(self, batch, capacity_for(needed), device, dtype, lean_kv, paging, text_slots)
        return self._state

    def row_streams(self, device) -> RowStreams:
        """One per loop and device: a captured step reads its tables at their addresses."""
        key = str(device)
        if self._streams is None or self._streams[0] != key:
            self._streams = (key, RowStreams(max(self.config.vocab_size, self.predictor.vocab_size), device))
        return self._streams[1]

    def rules(self, device, o: dict) -> tuple[Sampling, TalkerRules]:
        """(the code predictor's sampling, the talker's rules) from upstream's talker keywords `o`."""
        kw = dict(eos_token_id=o["eos_token_id"], suppress_tokens=tuple(o["suppress_tokens"]),
                  repetition_penalty=o["repetition_penalty"], do_sample=o["do_sample"], temperature=o["temperature"],
                  top_k=o["top_k"], top_p=o["top_p"])
        key = (device, *kw.values())
        rules = self._rules.get(key)
        if rules is None:
            while len(self._rules) >= 8:
                self._rules.popitem(last=False)
            rules = self._rules[key] = TalkerRules(self.config.vocab_size, device=device, **kw)
        self._rules.move_to_end(key)
        return Sampling(bool(o["subtalker_dosample"]), float(o["subtalker_temperature"]),
                        int(o["subtalker_top_k"] or 0), float(o["subtalker_top_p"])), rules

    def owner(self, device, dtype) -> tuple:
        t = self.talker
        return (device, dtype, self.stack.fingerprint(), self.predictor.owner(), t.codec_head.weight.data_ptr(),
                t.model.codec_embedding.weight.data_ptr(), t.model.norm.weight.data_ptr())

    def lean_talker(self, kind: str) -> Callable:
        """kind: "lean" (torch ops) or "fused" (morph/kernels/layers.py); a paged state's table goes with its pools."""
        return lambda x, st: lean.talker_pass(x, self.stack.weights(), self.talker.model.norm.weight, st.k, st.v,
                                              st.cos, st.sin, st.cache_pos, st.rope_pos, st.pads, self.stack.dims,
                                              kind == "fused", st.table)

    def frame_step(self, st: TalkerState, seq_groups: int, cp_sampling: Sampling, rules: TalkerRules,
                   talker_layers: Callable, predictor_layers: Callable, kind: str = "lean",
                   streams: RowStreams | None = None) -> None:
        """Decode frame `st.step` and sample the next code-0 token, all on the device, state advanced in place. With
        `streams` every row draws from its own random stream, else all from torch's generator as upstream."""
        t = self.talker
        own = st.step - st.start  # each row's own frame index (rows of a continuous batch join late)
        noise = torch_noise if streams is None else streams.frame(st.keys, own)
        e0 = F.embedding(st.code0.unsqueeze(1), t.model.codec_embedding.weight)  # [B, 1, H]
        pick, picker = _samplers(kind)
        codes = self.predictor.codes(torch.cat((st.past_hidden, e0), dim=1), seq_groups, cp_sampling,
                                     predictor_layers(), pick, noise)  # [B, 15]
        st.frames.index_copy_(1, st.step, torch.cat((st.code0.unsqueeze(1), codes), dim=1).unsqueeze(1))
        # upstream: cat([codec_embedding(code0)] + [cp.codec_embedding[i](code_i)], 1).sum(1) + text
        group_embeds = self.predictor.stacked_embeddings()[st.groups, codes]  # [B, 15, H]
        x = torch.cat((e0, group_embeds), dim=1).sum(1, keepdim=True) + st.text_at(own)
        h = talker_layers(x, st)  # [B, 1, H], normed
        nxt = st.step + 1
        st.past_hidden.copy_(h)
        if st.hidden is not None:
            st.hidden.index_copy_(1, nxt, h)
        token = rules.next_token(F.linear(h[:, -1], t.codec_head.weight), st.seen, own + 1, st.min_new, picker, noise)
        token = torch.where(nxt >= st.stop, rules.eos, token)  # a row's frame limit ends it as an EOS would
        token = torch.where(st.unfinished, token, rules.eos)  # finished rows pad with EOS, as HF does
        st.tokens.index_copy_(1, nxt, token.unsqueeze(1))
        st.seen.scatter_(1, token.unsqueeze(1), True)
        st.unfinished &= token != rules.eos
        st.any_left.copy_(st.unfinished.any())
        st.code0.copy_(token)
        st.advance()
