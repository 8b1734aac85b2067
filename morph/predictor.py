"""The morph code predictor: sequential groups, then a crossbar for the rest.

Upstream runs `code_predictor.generate()` once per 80 ms frame: a 2-token prefill and
14 one-token decodes through HF generate, each with a new DynamicCache and masks.
Here the same decoder layers are called directly against static KV buffers, with the
RoPE tables and masks built once per (device, dtype).

With `seq_groups = k`, groups 0..k-1 are decoded one after another exactly as upstream
does; groups k..14 are read off the hidden state that produced group k-1 through one
einsum over the stacked lm_head weights (the "crossbar"). k = 15 is upstream exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .sampling import Sampling, sample
from .static_cache import StaticKV


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


class MorphPredictor:
    """Replaces the code predictor's generate loop for one loaded model."""

    def __init__(self, code_predictor: torch.nn.Module):
        self.cp = code_predictor
        self.num_groups = code_predictor.config.num_code_groups - 1
        self.max_len = self.num_groups + 1  # a 2-token prefill, then one position per later group
        self._meta: dict[tuple, _DecodeMeta] = {}
        self._cache: StaticKV | None = None
        self._stacked: torch.Tensor | None = None

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

    def stacked_heads(self) -> torch.Tensor:
        """The 15 lm_head weights as one [15, V, H] tensor that the heads themselves view.

        Rebuilt whenever the heads stop viewing it (the model was moved or cast), so a
        device move by a memory manager never leaves a stale or duplicate copy behind.
        """
        heads = self.cp.lm_head
        w0 = heads[0].weight
        if (self._stacked is None or self._stacked.device != w0.device or self._stacked.dtype != w0.dtype
                or any(h.weight.data_ptr() != self._stacked[i].data_ptr() for i, h in enumerate(heads))):
            stacked = torch.stack([h.weight.detach() for h in heads])
            for i, h in enumerate(heads):
                h.weight = torch.nn.Parameter(stacked[i], requires_grad=False)
            self._stacked = stacked
        return self._stacked

    def release(self) -> None:
        """Give every lm_head its own storage again and drop all cached state."""
        if self._stacked is not None:
            for h in self.cp.lm_head:
                h.weight = torch.nn.Parameter(h.weight.detach().clone(), requires_grad=False)
        self._stacked, self._cache = None, None
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
    def predict(self, inputs_embeds: torch.Tensor, seq_groups: int, sampling: Sampling) -> torch.Tensor:
        """Codes of groups 1..15 for one frame: inputs_embeds [B, 2, H] -> int64 [B, 15]."""
        seq_groups = check_seq_groups(seq_groups, self.num_groups)
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
