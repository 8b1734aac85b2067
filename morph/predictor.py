"""The morph code predictor: sequential groups, then a crossbar for the rest.

Upstream runs `code_predictor.generate()` once per 80 ms frame: a 2-token prefill and
14 one-token decodes through HF generate, each with a new DynamicCache and masks.
Here the same decoder layers are called directly against static KV buffers, with the
RoPE tables and masks built once per (device, dtype).

With `seq_groups = k`, groups 0..k-1 are decoded one after another exactly as upstream
does; groups k..14 are read off the hidden state that produced group k-1 through one
einsum over the stacked lm_head weights (the "crossbar"). k = 15 is upstream exactly.

Two layer implementations, one step each:
- mode "eager" calls the HF decoder layers (`_hf_predict`): the exact CPU reference;
- modes "lean", "graphs" and "compile" run `step()`, the lean layers of morph/lean.py
  against fixed-shape buffers. "lean" runs it op by op; "graphs" captures that same
  call in a CUDA graph per (k, batch, dtype, sampling) and replays it; "compile" swaps
  the stack for its torch.compile'd twin before capturing. No step reads anything back
  to the host, so a whole frame's k passes, crossbar and sampling replay as one graph.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import graphs, lean
from .sampling import Sampling, sample
from .static_cache import StaticKV

log = logging.getLogger(__name__)


def check_seq_groups(seq_groups, num_groups: int = 15, who: str = "morph") -> int:
    """Return seq_groups as an int, or raise a ValueError that says the valid range."""
    if isinstance(seq_groups, bool) or not isinstance(seq_groups, int) or not 1 <= seq_groups <= num_groups:
        raise ValueError(
            f"{who}: seq_groups must be an integer from 1 to {num_groups}, got {seq_groups!r}; "
            f"use {num_groups} for upstream-exact output, or 5 (the default) for speed"
        )
    return seq_groups


@dataclass
class _DecodeMeta:
    """Everything a pass needs that does not depend on the frame being decoded."""

    cos: torch.Tensor  # [1, max_len, head_dim]
    sin: torch.Tensor
    positions: torch.Tensor  # [1, max_len]
    prefill_mask: torch.Tensor | None  # eager attention needs an explicit causal mask


class _LeanState:
    """Fixed buffers for the lean step at one (batch, device, dtype): written in place by
    every pass, so a captured graph can replay against them."""

    def __init__(self, pred: "MorphPredictor", batch: int, device: torch.device, dtype: torch.dtype):
        cfg, d = pred.cp.config, pred.stack.dims
        length = pred.max_len
        with torch.inference_mode(False), torch.no_grad():
            shape = (batch, d.kv_heads, length, d.head_dim)
            # zeros, not empty: masked slots are multiplied by 0, and 0 * NaN garbage is NaN
            self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
            self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
            self.cos, self.sin = lean.rope_tables(pred.cp.model.rotary_emb, length, device, dtype, multimodal=False)
            self.bias = lean.causal_bias_table(length, device, dtype)
            self.prefill_idx = torch.arange(2, device=device)
            self.pass_idx = [torch.tensor([g + 1], device=device) for g in range(pred.num_groups)]
            self.static_in = None  # the graph path's input buffer, made on first capture


class MorphPredictor:
    """Replaces the code predictor's generate loop for one loaded model."""

    def __init__(self, code_predictor: torch.nn.Module, mode: str = "auto", max_graphs: int = 4):
        self.cp = code_predictor
        self.num_groups = code_predictor.config.num_code_groups - 1
        self.max_len = self.num_groups + 1  # a 2-token prefill, then one position per later group
        self.mode = graphs.check_mode(mode)
        self._meta: dict[tuple, _DecodeMeta] = {}
        self._cache: StaticKV | None = None
        self._stacked: torch.Tensor | None = None
        self._stacked_emb: torch.Tensor | None = None
        self._stack: lean.FusedStack | None = None
        self._states: collections.OrderedDict = collections.OrderedDict()
        self.graphs = graphs.GraphCache(max_graphs)
        self._graph_failed = False

    # -- one-time state -------------------------------------------------------------
    def _decode_meta(self, device: torch.device, dtype: torch.dtype) -> _DecodeMeta:
        key = (device, dtype)
        if key not in self._meta:
            positions = torch.arange(self.max_len, device=device).unsqueeze(0)
            probe = torch.zeros(1, device=device, dtype=dtype)
            cos, sin = self.cp.model.rotary_emb(probe, positions)
            mask = None
            if self.cp.config._attn_implementation == "eager":
                mask = torch.zeros(1, 1, 2, 2, device=device, dtype=dtype)
                mask[..., 0, 1] = torch.finfo(dtype).min
            self._meta[key] = _DecodeMeta(cos, sin, positions, mask)
        return self._meta[key]

    def _kv(self, batch: int, device: torch.device, dtype: torch.dtype) -> StaticKV:
        if self._cache is None or not self._cache.matches(batch, device, dtype):
            cfg = self.cp.config
            self._cache = StaticKV(cfg.num_hidden_layers, batch, cfg.num_key_value_heads, self.max_len,
                                   cfg.head_dim, device, dtype)
        self._cache.reset()
        return self._cache

    @staticmethod
    def _stack_views(modules, current: torch.Tensor | None) -> torch.Tensor:
        """Stack the modules' weights into one tensor that the modules themselves view.

        Rebuilt whenever they stop viewing it (the model was moved or cast), so a device
        move by a memory manager never leaves a stale or duplicate copy behind.
        """
        w0 = modules[0].weight
        if (current is None or current.device != w0.device or current.dtype != w0.dtype
                or any(m.weight.data_ptr() != current[i].data_ptr() for i, m in enumerate(modules))):
            with torch.inference_mode(False), torch.no_grad():
                current = torch.stack([m.weight.detach() for m in modules])
                for i, m in enumerate(modules):
                    m.weight = torch.nn.Parameter(current[i], requires_grad=False)
        return current

    def stacked_heads(self) -> torch.Tensor:
        """The 15 lm_head weights as one [15, V, H] tensor that the heads themselves view."""
        self._stacked = self._stack_views(self.cp.lm_head, self._stacked)
        return self._stacked

    def stacked_embeddings(self) -> torch.Tensor:
        """The 15 codec embeddings as one [15, V, H_talker] tensor that the embeddings view."""
        self._stacked_emb = self._stack_views(self.cp.model.codec_embedding, self._stacked_emb)
        return self._stacked_emb

    @property
    def stack(self) -> lean.FusedStack:
        if self._stack is None:
            self._stack = lean.FusedStack(self.cp.model.layers, self.cp.model.norm, self.cp.config)
        return self._stack

    def release(self) -> None:
        """Give every lm_head, embedding and projection its own storage again and drop all cached state."""
        self.graphs.clear()
        self._states.clear()
        with torch.inference_mode(False), torch.no_grad():
            for stacked, modules in ((self._stacked, self.cp.lm_head), (self._stacked_emb, self.cp.model.codec_embedding)):
                if stacked is not None:
                    for m in modules:
                        m.weight = torch.nn.Parameter(m.weight.detach().clone(), requires_grad=False)
        if self._stack is not None:
            self._stack.release()
        self._stacked, self._stacked_emb, self._stack, self._cache = None, None, None, None
        self._meta.clear()

    # -- decoding -------------------------------------------------------------------
    def _pass(self, embeds: torch.Tensor, kv: StaticKV, meta: _DecodeMeta) -> torch.Tensor:
        """Run new positions through the layers; returns the normed hidden states [B, n, H]."""
        h = self.cp.small_to_mtp_projection(embeds)
        start, n = kv.length, h.shape[1]
        window = slice(start, start + n)
        positions = meta.positions[:, window]
        for layer in self.cp.model.layers:
            out = layer(
                h,
                attention_mask=meta.prefill_mask if n > 1 else None,
                position_ids=positions,
                past_key_values=kv,
                use_cache=True,
                cache_position=positions[0],
                position_embeddings=(meta.cos[:, window], meta.sin[:, window]),
            )
            h = out[0] if isinstance(out, tuple) else out
        kv.advance(n)
        return self.cp.model.norm(h)

    @torch.no_grad()
    def predict(self, inputs_embeds: torch.Tensor, seq_groups: int, sampling: Sampling,
                mode: str | None = None) -> torch.Tensor:
        """Codes of groups 1..15 for one frame: inputs_embeds [B, 2, H] -> int64 [B, 15]."""
        seq_groups = check_seq_groups(seq_groups, self.num_groups)
        mode = graphs.resolve_mode(mode or self.mode, inputs_embeds.device)
        if mode in graphs.GRAPH_MODES and self._graph_failed:
            mode = "eager"
        if mode == "eager":
            return self._hf_predict(inputs_embeds, seq_groups, sampling)
        if mode == "lean":
            return self.step(inputs_embeds, seq_groups, sampling)
        try:
            return self._graph_predict(inputs_embeds, seq_groups, sampling, compiled=mode == "compile")
        except Exception as e:  # capture or compile failed: the eager path still works
            self._graph_failed = True
            self.graphs.clear()
            log.warning("morph: CUDA graph capture failed (%s: %s); the code predictor runs eager from now on",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return self._hf_predict(inputs_embeds, seq_groups, sampling)

    def _hf_predict(self, inputs_embeds: torch.Tensor, seq_groups: int, sampling: Sampling) -> torch.Tensor:
        device, dtype = inputs_embeds.device, inputs_embeds.dtype
        meta, kv, heads = self._decode_meta(device, dtype), self._kv(inputs_embeds.shape[0], device, dtype), \
            self.stacked_heads()
        embeddings = self.cp.model.codec_embedding

        codes: list[torch.Tensor] = []
        hidden = self._pass(inputs_embeds, kv, meta)
        for g in range(seq_groups):
            if g:
                hidden = self._pass(embeddings[g - 1](codes[-1].unsqueeze(1)), kv, meta)
            # upstream projects every position of the pass, then keeps the last one
            codes.append(sample(F.linear(hidden, heads[g])[:, -1], sampling))
        if seq_groups < self.num_groups:
            crossbar = torch.einsum("bh,gvh->bgv", hidden[:, -1], heads[seq_groups:])
            codes.extend(sample(crossbar, sampling).unbind(1))
        return torch.stack(codes, dim=1)

    # -- the lean step: one definition for eager, graphs and compile --------------------
    def owner(self, device: torch.device, dtype: torch.dtype) -> tuple:
        """What the captured graphs point at: a change means they must be captured again."""
        proj = self.cp.small_to_mtp_projection
        proj_ptr = proj.weight.data_ptr() if isinstance(proj, torch.nn.Linear) else None
        return (device, dtype, self.stack.fingerprint(), self.stacked_heads().data_ptr(),
                self.stacked_embeddings().data_ptr(), proj_ptr)

    def lean_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> _LeanState:
        key = (batch, device, dtype)
        state = self._states.get(key)
        if state is None:
            while len(self._states) >= 4:  # graphs that still use an evicted state keep it alive
                self._states.popitem(last=False)
            state = self._states[key] = _LeanState(self, batch, device, dtype)
        self._states.move_to_end(key)
        return state

    def step(self, inputs_embeds: torch.Tensor, seq_groups: int, sampling: Sampling,
             compiled: bool = False, state: _LeanState | None = None) -> torch.Tensor:
        """The lean frame step: inputs_embeds [B, 2, H] -> codes [B, 15]; no host syncs."""
        device, dtype = inputs_embeds.device, inputs_embeds.dtype
        st = state or self.lean_state(inputs_embeds.shape[0], device, dtype)
        weights, norm_w, d = self.stack.weights(), self.cp.model.norm.weight, self.stack.dims
        heads, embeddings = self.stacked_heads(), self.stacked_embeddings()
        proj = self.cp.small_to_mtp_projection
        proj_w, proj_b = (proj.weight, proj.bias) if isinstance(proj, torch.nn.Linear) else (None, None)
        run = graphs.compiled(lean.predictor_pass) if compiled else lean.predictor_pass
        pick = graphs.compiled(sample, exact_rng=True) if compiled else sample

        def layers(x, idx):
            return run(x, proj_w, proj_b, weights, norm_w, st.k, st.v, st.cos, st.sin, idx, st.bias, d)

        hidden = layers(inputs_embeds, st.prefill_idx)[:, -1]
        codes: list[torch.Tensor] = []
        for g in range(seq_groups):
            if g:
                hidden = layers(F.embedding(codes[-1].unsqueeze(1), embeddings[g - 1]), st.pass_idx[g])[:, -1]
            codes.append(pick(F.linear(hidden, heads[g]), sampling))
        if seq_groups < self.num_groups:
            crossbar = torch.einsum("bh,gvh->bgv", hidden, heads[seq_groups:])
            codes.extend(pick(crossbar, sampling).unbind(1))
        return torch.stack(codes, dim=1)

    def _graph_predict(self, inputs_embeds: torch.Tensor, seq_groups: int, sampling: Sampling,
                       compiled: bool) -> torch.Tensor:
        device, dtype, batch = inputs_embeds.device, inputs_embeds.dtype, inputs_embeds.shape[0]
        self.graphs.bind(self.owner(device, dtype))
        st = self.lean_state(batch, device, dtype)
        if st.static_in is None:
            with torch.inference_mode(False), torch.no_grad():
                st.static_in = torch.zeros(inputs_embeds.shape, device=device, dtype=dtype)
        key = ("predictor", seq_groups, batch, dtype, sampling, compiled)
        entry = self.graphs.get(key, lambda: self.step(st.static_in, seq_groups, sampling, compiled, st))
        entry.state = st  # keep the buffers the graph writes alive as long as the graph
        st.static_in.copy_(inputs_embeds)
        return entry.replay().clone()
