"""A prompt's prefill on the lean layers: what upstream's talker forward computes for a left-padded prompt batch (its
keys and values, the last position's logits and hidden state), without HF's per-call machinery (the 4-D mask, the
rotary module, configuration look-ups and cache objects), whose host time was most of a short request's first audio.
The continuous batch prefills its groups here.

It follows upstream's forward exactly where it decides something: a row's token i (i >= its left padding p) sits at
rotary position i - p, as the talker's get_rope_index gives a text-only prompt, and attends to its own tokens p..i.
Attention is spelled out (morph/masked_attention.py says why) where upstream's default runs torch's
scaled_dot_product_attention: the same sums, the softmax in float32. The residual stream is kept in fp32 and rounded
where a layer reads it, as the lean frame step does (morph/decode/lean.py), so the prompt and the frames after it
round alike. Pad tokens attend to their own slot only: what they compute is never read
(every real token's bound hides it), but it stays finite.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..masked_attention import masked_attention
from .lean import Dims, LayerW, mlp, project, rms_norm


class Prefilled(NamedTuple):
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [rows, kv_heads, L, D]
    logits: torch.Tensor  # [rows, vocab]: the last position's
    past_hidden: torch.Tensor  # [rows, 1, hidden]: the last position's hidden state, normed


def lean_prefill(inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, weights: list[LayerW],
                 norm_w: torch.Tensor, head_w: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                 d: Dims, into: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Prefilled:
    """The talker over a left-padded prompt batch: inputs_embeds [rows, L, hidden], attention_mask [rows, L] (1 on the
    prompt's tokens, 0 on the padding before them); cos/sin_table [>= L, D] (lean.rope_tables); head_w: the codec head's
    weight; into: per layer (keys, values) [rows, kv_heads, L, D] that the keys and values are written into (a CUDA
    graph's outputs, prefill_graphs.py), else they are new tensors."""
    rows, length, _ = inputs_embeds.shape
    device = inputs_embeds.device
    pads = length - attention_mask.sum(-1).to(torch.long)  # [rows]
    slots = torch.arange(length, device=device)
    positions = (slots.unsqueeze(0) - pads.unsqueeze(1)).clamp(min=0)  # [rows, L]
    cos, sin = cos_table[positions].unsqueeze(1), sin_table[positions].unsqueeze(1)  # [rows, 1, L, D]
    # causal over the row's own tokens; a pad token sees its own slot only (finite, never read)
    allowed = (slots.view(1, 1, -1) <= slots.view(1, -1, 1)) & (slots.view(1, 1, -1) >= pads.view(-1, 1, 1))
    allowed |= torch.eye(length, dtype=torch.bool, device=device).unsqueeze(0)
    mask = allowed.unsqueeze(1)  # [rows, 1, L, L]
    x = inputs_embeds.to(torch.float32)
    kv = []
    for i, w in enumerate(weights):  # lean.layer_step's layer, its attention over the prompt alone
        q, k, v = project(x, w, cos, sin, d)
        # v is a view into the layer's fused q/k/v projection: kept as it is, every layer's whole projection (four
        # times the values) stayed alive until the rows joined, 2.5x the keys and values a token
        kv.append((k, v.contiguous()) if into is None else (into[i][0].copy_(k), into[i][1].copy_(v)))
        x = mlp(x + F.linear(masked_attention(q, k, v, mask, d.scale), w.wo), w, d)
    last = rms_norm(x[:, -1:], norm_w, d.eps)  # [rows, 1, hidden]
    return Prefilled(kv, F.linear(last[:, -1], head_w), last)
