"""The frame step every mode runs, what it runs on, and the reference loop around it.

`TalkerLoop` owns, for one model, what a frame step needs: the lean stack and the predictor, the step's static state
(talker_state.py), the sampling rules, the rows' random streams, the CUDA graphs of the fast modes. `frame_step` is the
one step: the predictor's codes (predictor.py), the embedding sum plus the trailing text (or tts_pad), one talker step,
the codec head, upstream's logits rules (sampling.py), all on the device. The continuous batch (morph/engine/batch.py)
runs it on the lean layers over a paged or dense cache, op by op or replayed from a CUDA graph (runner.py decides how).

`generate` is the reference loop, eager mode's: it stands in for upstream `talker.generate` (HF generate: per frame
the predictor's generate, a 16-way embedding sum, one token through the talker's HF layers with a DynamicCache, the
logits processors and a draw, host syncs throughout) on one model instance, runs the same step on the checkpoint's own
HF layers after upstream's own prefill, and returns what upstream's `Qwen3TTSForConditionalGeneration.generate` reads
from it (`hidden_states`, one `(hidden, codes)` entry per step), so EOS trimming stays upstream's. The host reads
back a "rows left" flag a few frames behind the GPU (the queue never drains).
"""

from __future__ import annotations

import collections
import functools
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

from ..settings import Sampling, capacity_for
from .. import graphs
from . import lean
from .fused_stack import FusedStack
from .predictor import Predictor
from .prefill_graphs import PrefillGraphs
from .sampling import TalkerRules, fused_pick, sample, talker_pick, torch_noise
from .streams import RowStreams
from .hf_talker import HFTalker
from .talker_state import TalkerState


def _samplers(kind: str) -> tuple[Callable, Callable]:
    """(code predictor's pick, talker's pick) for a kind of step."""
    if kind == "fused":
        return fused_pick, functools.partial(talker_pick, pick_fn=fused_pick)
    return sample, talker_pick


class TalkerLoop:
    """Owns the talker decode for one model: `generate` stands in for `talker.generate`."""

    def __init__(self, talker: torch.nn.Module, max_graphs: int = 4):
        self.talker, self.config = talker, talker.config
        self.predictor = Predictor(talker.code_predictor)
        self._stack: FusedStack | None = None
        self.graphs = graphs.GraphCache(max_graphs)
        self.prefills = PrefillGraphs()  # the continuous batch's prefills of joining rows
        self._state: TalkerState | None = None
        self._rules: collections.OrderedDict = collections.OrderedDict()
        self.sync_lag = 4  # frames the host may run ahead of the GPU before it reads the EOS flag
        self.min_new_tokens: int | None = None  # benchmarks: hold EOS back this long (fixed-length runs)
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

    def release(self) -> None:
        """Drop the graphs, buffers and fused weight storage; all rebuilt on the next call."""
        self.graphs.clear()
        self.prefills.clear()
        self._state = None
        self._rules.clear()
        self._streams = None
        if self._stack is not None:
            self._stack.release()
            self._stack = None
        self.predictor.release()
        graphs.trim_graph_memory()

    def state(self, batch: int, needed: int, device, dtype, lean_kv: bool, paging: tuple[int, int] | None = None,
              text_slots: int | None = None):
        """The static state; `lean_kv`, `paging` (pages, page size), `text_slots`: TalkerState's."""
        kept = self._state
        if kept is None or not kept.matches(batch, needed, device, dtype, lean_kv, paging, text_slots):
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

    def rules(self, device, **kw) -> TalkerRules:
        key = (device, tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in kw.items())))
        rules = self._rules.get(key)
        if rules is None:
            while len(self._rules) >= 8:
                self._rules.popitem(last=False)
            rules = self._rules[key] = TalkerRules(self.config.vocab_size, device=device, **kw)
        self._rules.move_to_end(key)
        return rules

    def owner(self, device, dtype) -> tuple:
        t = self.talker
        return (device, dtype, self.stack.fingerprint(), self.predictor.owner(), t.codec_head.weight.data_ptr(),
                t.model.codec_embedding.weight.data_ptr(), t.model.norm.weight.data_ptr())

    def lean_talker(self, kind: str) -> Callable:
        """kind: "lean" (torch ops) or "fused" (morph/kernels/layers.py); a paged state's table goes with its pools."""
        return lambda x, st: lean.talker_pass(x, self.stack.weights(), self.talker.model.norm.weight, st.k, st.v,
                                              st.cos, st.sin, st.cache_pos, st.rope_pos, st.pads, self.stack.dims,
                                              kind == "fused", st.table)

    # -- the step: one definition for every mode --------------------------------------------
    def frame_step(self, st: TalkerState, seq_groups: int, cp_sampling: Sampling, rules: TalkerRules,
                   talker_layers: Callable, predictor_layers: Callable, kind: str = "lean",
                   streams: RowStreams | None = None) -> None:
        """Decode frame `st.step` and sample the next code-0 token; all state is advanced in place.
        kind ("lean" or "fused") picks the samplers that go with the layers; with `streams` every row draws
        from its own random stream (morph/decode/streams.py), else all from torch's generator as upstream."""
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
        token = rules.next_token(F.linear(h[:, -1], t.codec_head.weight), st.seen, own + 1, st.min_new, picker,
                                 noise)
        token = torch.where(nxt >= st.stop, rules.eos, token)  # a row's frame limit ends it as an EOS would
        token = torch.where(st.unfinished, token, rules.eos)  # finished rows pad with EOS, as HF does
        st.tokens.index_copy_(1, nxt, token.unsqueeze(1))
        st.seen.scatter_(1, token.unsqueeze(1), True)
        st.unfinished &= token != rules.eos
        st.any_left.copy_(st.unfinished.any())
        st.code0.copy_(token)
        st.advance()

    # -- the reference loop ---------------------------------------------------------------
    def generate(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, trailing_text_hidden: torch.Tensor,
                 tts_pad_embed: torch.Tensor, *, seq_groups: int, max_new_tokens: int, min_new_tokens: int = 2,
                 do_sample: bool = True, top_k: int = 50, top_p: float = 1.0, temperature: float = 0.9,
                 repetition_penalty: float = 1.0, eos_token_id: int = None, suppress_tokens=None,
                 subtalker_dosample: bool = True, subtalker_top_k: int = 50, subtalker_top_p: float = 1.0,
                 subtalker_temperature: float = 0.9, on_step: Callable[[], None] | None = None,
                 row_stops: list[int] | None = None) -> SimpleNamespace:
        """Upstream's talker.generate for one batch on the checkpoint's own HF layers: the exact reference (the
        other modes run the continuous batch, morph/engine/). row_stops[i]: the frame at which row i ends (EOS
        forced), max_new_tokens where not given."""
        device, dtype = inputs_embeds.device, inputs_embeds.dtype
        batch, prompt_len = inputs_embeds.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(batch, prompt_len, dtype=torch.long, device=device)
        cp_sampling = Sampling(bool(subtalker_dosample), float(subtalker_temperature), int(subtalker_top_k or 0),
                               float(subtalker_top_p))
        with torch.inference_mode():
            rules = self.rules(device, eos_token_id=eos_token_id if eos_token_id is not None
                               else self.config.codec_eos_token_id, suppress_tokens=tuple(suppress_tokens or ()),
                               repetition_penalty=repetition_penalty, do_sample=do_sample, temperature=temperature,
                               top_k=top_k, top_p=top_p)
            st = self.state(batch, prompt_len + max_new_tokens, device, dtype, lean_kv=False)
            st.start.zero_()
            st.stop.copy_(torch.as_tensor(row_stops or [max_new_tokens] * batch, device=device))
            cache = self._prefill(st, rules, inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed,
                                  self.hold(min_new_tokens))
            talker_layers = HFTalker(self.talker, cache, attention_mask, prompt_len)
            del cache  # the HF layers hold it

            def step():
                self.frame_step(st, seq_groups, cp_sampling, rules, talker_layers,
                                lambda: self.predictor.hf_layers(batch, device, dtype))

            frames_run = self._decode(st, step, max_new_tokens - 1, on_step)
            tokens = st.tokens[:, :frames_run + 1].cpu()
        frames = self._frames_kept(tokens, rules.eos, frames_run)
        codes, hidden = st.frames[:, :frames].clone(), st.hidden[:, :frames + 1].clone()
        self.last_run = dict(mode="eager", seq_groups=seq_groups, frames_run=frames_run, frames=frames,
                             capacity=st.capacity)
        steps = [((hidden[:, 0:1],), None)] + [((hidden[:, j + 1:j + 2],), codes[:, j]) for j in range(frames)]
        return SimpleNamespace(hidden_states=steps, sequences=tokens[:, :frames + 1].to(device))

    def hold(self, min_new_tokens: int) -> int:
        """Frames before EOS may be drawn: upstream's min_new_tokens, or a benchmark's hold."""
        return min_new_tokens if self.min_new_tokens is None else self.min_new_tokens

    def prefill(self, inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed):
        """Upstream's own talker forward over a (left-padded) prompt batch, with a fresh DynamicCache."""
        from transformers.cache_utils import DynamicCache

        prompt_len = inputs_embeds.shape[1]
        return self.talker(inputs_embeds=inputs_embeds, attention_mask=attention_mask, past_key_values=DynamicCache(),
                           use_cache=True, cache_position=torch.arange(prompt_len, device=inputs_embeds.device),
                           trailing_text_hidden=trailing_text_hidden, tts_pad_embed=tts_pad_embed, return_dict=True)

    def _prefill(self, st: TalkerState, rules: TalkerRules, inputs_embeds, attention_mask, trailing_text_hidden,
                 tts_pad_embed, min_new_tokens: int):
        """Upstream's own prefill, then the state for frame 0; returns the prefill's DynamicCache."""
        prompt_len = inputs_embeds.shape[1]
        out = self.prefill(inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed)
        st.min_new.fill_(int(min_new_tokens))
        st.seen.zero_()
        token = rules.next_token(out.logits[:, -1], st.seen, torch.zeros_like(st.min_new), st.min_new)
        pads = prompt_len - attention_mask.sum(-1).to(torch.long)
        st.code0.copy_(token)
        st.past_hidden.copy_(out.past_hidden)
        st.step.zero_()
        st.cache_pos.fill_(prompt_len)
        st.pads.copy_(pads)
        st.rope_pos.copy_(prompt_len - pads)
        st.seen.scatter_(1, token.unsqueeze(1), True)
        st.unfinished.copy_(token != rules.eos)
        st.any_left.copy_(st.unfinished.any())
        st.tokens[:, 0] = token
        st.hidden[:, 0:1] = out.past_hidden
        st.put_text(slice(None), trailing_text_hidden, tts_pad_embed)
        return out.past_key_values

    def _decode(self, st: TalkerState, run: Callable[[], object], max_frames: int,
                on_step: Callable[[], None] | None) -> int:
        """Run up to max_frames steps; stop once every row has emitted EOS. Returns steps run."""
        cuda, ring = st.device.type == "cuda", self.sync_lag + 2
        flags = torch.ones(ring, dtype=torch.bool, pin_memory=cuda)
        pending: collections.deque = collections.deque()
        frames = 0
        if not bool(st.any_left):
            return 0
        for j in range(max_frames):
            if on_step is not None:
                on_step()
            run()
            frames += 1
            if not cuda:
                if not bool(st.any_left):
                    break
                continue
            flags[j % ring].copy_(st.any_left, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            pending.append((event, j % ring))
            if len(pending) > self.sync_lag:
                event, i = pending.popleft()
                event.synchronize()
                if not bool(flags[i]):
                    break
        return frames

    @staticmethod
    def _frames_kept(tokens: torch.Tensor, eos: int, frames_run: int) -> int:
        """Frames upstream would have returned: HF stops once every row has sampled EOS."""
        is_eos = tokens == eos  # [B, frames_run + 1]
        if not bool(is_eos.any(dim=1).all()):
            return frames_run
        return min(int(is_eos.int().argmax(dim=1).max()), frames_run)
