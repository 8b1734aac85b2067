"""The code predictor's part of a frame: `seq_groups = k` groups decoded one after another as upstream does (k = 15 is
upstream exactly), the rest read off the last hidden state by the crossbar (docs/architecture.md, How morph works).
`codes` is the step; `Layers` runs it on the modules' forward (`hf_layers`) or the lean layers, a frame a CUDA graph."""

from __future__ import annotations

import collections
import copy
from typing import Callable

import torch
import torch.nn.functional as F

from . import lean
from .fused_stack import FusedStack, unfuse
from ..settings import Sampling
from .sampling import Noise, pick, torch_noise

Run = Callable[[torch.Tensor, int], torch.Tensor]  # (embeds [B, n, H], group) -> normed hidden [B, n, H_cp]


class ModuleHeads:
    """The lm_head modules themselves, as upstream calls them (mode "eager"). Their weights stay where loading put
    them: the CPU GEMM can round a logit differently for the same weights at another address, flipping a tie."""

    def __init__(self, lm_head: torch.nn.ModuleList):
        self.heads = lm_head

    def logits(self, h: torch.Tensor, g: int) -> torch.Tensor:
        return self.heads[g](h)

    def crossbar(self, h_last: torch.Tensor, start: int) -> torch.Tensor:
        return torch.stack([head(h_last) for head in self.heads[start:]], dim=1)


class StackedHeads:
    """The 15 lm_head weights as one [15, V, H] tensor: a group's slice, or the rest in one einsum."""

    def __init__(self, stacked: torch.Tensor):
        self.stacked = stacked

    def logits(self, h: torch.Tensor, g: int) -> torch.Tensor:
        return F.linear(h, self.stacked[g])

    def crossbar(self, h_last: torch.Tensor, start: int) -> torch.Tensor:
        return torch.einsum("bh,gvh->bgv", h_last, self.stacked[start:])


class Layers:
    """One mode's passes over a frame: `layers(embeds, group)` runs the layers (Run), `heads` reads logits off them."""

    def __init__(self, run: Run, heads: ModuleHeads | StackedHeads):
        self.run, self.heads = run, heads

    def __call__(self, x: torch.Tensor, g: int) -> torch.Tensor:
        return self.run(x, g)


class LeanState:
    """Fixed buffers for the lean layers at one (batch, device, dtype), written in place for captured graphs."""

    def __init__(self, pred: "Predictor", batch: int, device: torch.device, dtype: torch.dtype):
        d, length = pred.stack.dims, pred.max_len
        with torch.inference_mode(False), torch.no_grad():
            shape = (batch, d.kv_heads, length, d.head_dim)
            # zeros, not empty: masked slots are multiplied by 0, and 0 * NaN garbage is NaN
            self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in pred.cp.model.layers]
            self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in pred.cp.model.layers]
            self.cos, self.sin = lean.rope_tables(pred.cp.model.rotary_emb, length, device, dtype, multimodal=False)
            self.lo = torch.zeros(batch, dtype=torch.long, device=device)  # causal from slot 0
            # pass g writes positions 0,1 (g = 0, the 2-token prefill) or g + 1
            self.idx = [torch.arange(2, device=device)] + [torch.tensor([g + 1], device=device)
                                                             for g in range(1, pred.num_groups)]

    def rows(self, n: int) -> "LeanState":
        """The first n rows, viewing these buffers: nothing in them outlives a frame, so moved rows need no copy."""
        view = copy.copy(self)
        view.k, view.v, view.lo = [t[:n] for t in self.k], [t[:n] for t in self.v], self.lo[:n]
        return view


class _HFCache:
    """HF attention's one cache call, `update`, over preallocated buffers, returning what a DynamicCache would."""

    def __init__(self, n_layers: int, shape: tuple, device, dtype):
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.length = 0

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        end = self.length + key_states.shape[-2]
        self.keys[layer_idx][:, :, self.length:end] = key_states
        self.values[layer_idx][:, :, self.length:end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]


class HFState:
    """What the HF layers need besides the frame's input, built once per (batch, device, dtype)."""

    def __init__(self, pred: "Predictor", batch: int, device: torch.device, dtype: torch.dtype):
        cfg = pred.cp.config
        with torch.inference_mode(False), torch.no_grad():  # reused in and outside inference mode
            self.cache = _HFCache(len(pred.cp.model.layers), (batch, cfg.num_key_value_heads, pred.max_len,
                                                              cfg.head_dim), device, dtype)
            self.positions = torch.arange(pred.max_len, device=device).unsqueeze(0)
            self.cos, self.sin = pred.cp.model.rotary_emb(torch.zeros(1, device=device, dtype=dtype), self.positions)
            self.prefill_mask = None
            if cfg._attn_implementation == "eager":  # sdpa builds its causal mask itself
                self.prefill_mask = torch.zeros(1, 1, 2, 2, device=device, dtype=dtype)
                self.prefill_mask[..., 0, 1] = torch.finfo(dtype).min


class Predictor:
    def __init__(self, code_predictor: torch.nn.Module):
        self.cp = code_predictor
        self.num_groups = code_predictor.config.num_code_groups - 1
        self.vocab_size = int(code_predictor.config.vocab_size)
        self.max_len = self.num_groups + 1  # a 2-token prefill, then one position per later group
        self._stacked: torch.Tensor | None = None
        self._stacked_emb: torch.Tensor | None = None
        self._stack: FusedStack | None = None
        self._states: collections.OrderedDict = collections.OrderedDict()

    @staticmethod
    def _stack_views(modules, current: torch.Tensor | None) -> torch.Tensor:
        """The modules' weights as one tensor they view, stacked again once they stop (the model was moved or cast)."""
        w0 = modules[0].weight
        if (current is None or current.device != w0.device or current.dtype != w0.dtype
                or any(m.weight.data_ptr() != current[i].data_ptr() for i, m in enumerate(modules))):
            with torch.inference_mode(False), torch.no_grad():
                current = torch.stack([m.weight.detach() for m in modules])
                for i, m in enumerate(modules):
                    m.weight = torch.nn.Parameter(current[i], requires_grad=False)
        return current

    def stacked_heads(self) -> torch.Tensor:
        self._stacked = self._stack_views(self.cp.lm_head, self._stacked)
        return self._stacked

    def stacked_embeddings(self) -> torch.Tensor:
        """The 15 codec embeddings as one [15, V, H_talker] tensor that the embeddings view."""
        self._stacked_emb = self._stack_views(self.cp.model.codec_embedding, self._stacked_emb)
        return self._stacked_emb

    @property
    def stack(self) -> FusedStack:
        if self._stack is None:
            self._stack = FusedStack(self.cp.model.layers, self.cp.model.norm, self.cp.config)
        return self._stack

    def owner(self) -> tuple:
        """What captured graphs point at: a change means they must be captured again."""
        proj = self.cp.small_to_mtp_projection
        return (self.stack.fingerprint(), self.stacked_heads().data_ptr(), self.stacked_embeddings().data_ptr(),
                proj.weight.data_ptr() if isinstance(proj, torch.nn.Linear) else None)

    def release(self) -> None:
        """Give every lm_head, embedding and projection its own storage again; drop all state."""
        self._states.clear()
        for stacked, modules in ((self._stacked, self.cp.lm_head), (self._stacked_emb, self.cp.model.codec_embedding)):
            if stacked is not None:
                unfuse(modules)
        if self._stack is not None:
            self._stack.release()
        self._stacked, self._stacked_emb, self._stack = None, None, None

    def _state(self, kind: type, batch: int, device: torch.device, dtype: torch.dtype):
        key = (kind, batch, device, dtype)
        state = self._states.get(key)
        if state is None:
            while len(self._states) >= 4:  # graphs that still use an evicted state keep it alive
                self._states.popitem(last=False)
            state = self._states[key] = kind(self, batch, device, dtype)
        self._states.move_to_end(key)
        return state

    def lean_state(self, batch: int, device: torch.device, dtype: torch.dtype) -> LeanState:
        return self._state(LeanState, batch, device, dtype)

    def lean_layers(self, st: LeanState, kind: str) -> Layers:
        """kind: "lean" (torch ops) or "fused" (morph/kernels/layers.py)."""
        weights, norm_w, d = self.stack.weights(), self.cp.model.norm.weight, self.stack.dims
        proj = self.cp.small_to_mtp_projection
        proj_w, proj_b = (proj.weight, proj.bias) if isinstance(proj, torch.nn.Linear) else (None, None)
        return Layers(lambda x, g: lean.predictor_pass(x, proj_w, proj_b, weights, norm_w, st.k, st.v, st.cos, st.sin,
                                                       st.idx[g], st.lo, d, kind == "fused"),
                      StackedHeads(self.stacked_heads()))

    def hf_layers(self, batch: int, device: torch.device, dtype: torch.dtype) -> Layers:
        """The modules' own layers and lm_heads, called as upstream's generate calls them, for one frame."""
        st: HFState = self._state(HFState, batch, device, dtype)
        st.cache.length = 0  # a new frame: upstream starts a fresh cache

        def layers(x: torch.Tensor, g: int) -> torch.Tensor:
            h = self.cp.small_to_mtp_projection(x)
            window = slice(st.cache.length, st.cache.length + h.shape[1])
            for layer in self.cp.model.layers:
                out = layer(h, attention_mask=st.prefill_mask if h.shape[1] > 1 else None,
                            position_ids=st.positions[:, window], past_key_values=st.cache, use_cache=True,
                            cache_position=st.positions[0, window],
                            position_embeddings=(st.cos[:, window], st.sin[:, window]))
                h = out[0] if isinstance(out, tuple) else out
            st.cache.length = window.stop
            return self.cp.model.norm(h)

        return Layers(layers, ModuleHeads(self.cp.lm_head))

    def codes(self, inputs_embeds: torch.Tensor, seq_groups: int, sampling: Sampling, layers: Layers,
              pick: Callable = pick, noise: Noise = torch_noise) -> torch.Tensor:
        """Codes of groups 1..15 for one frame: inputs_embeds [B, 2, H] -> int64 [B, 15], with no host sync. Group g
        draws at slot g + 1 of the frame's random stream (slot 0 is the talker's)."""
        heads, embeddings = layers.heads, self.stacked_embeddings()
        codes: list[torch.Tensor] = []
        h = layers(inputs_embeds, 0)
        for g in range(seq_groups):
            if g:
                h = layers(F.embedding(codes[-1].unsqueeze(1), embeddings[g - 1]), g)
            # upstream projects every position of the pass, then keeps the last one
            codes.append(pick(heads.logits(h, g)[:, -1], sampling, noise, g + 1))
        if seq_groups < self.num_groups:
            codes.extend(pick(heads.crossbar(h[:, -1], seq_groups), sampling, noise, seq_groups + 1).unbind(1))
        return torch.stack(codes, dim=1)
