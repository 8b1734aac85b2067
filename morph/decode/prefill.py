"""A prompt's prefill on the lean layers: what upstream's talker forward computes for a left-padded prompt batch (its
keys and values, the last position's logits and hidden state), without HF's per-call machinery (the 4-D mask, the
rotary module, configuration look-ups and cache objects), whose host time was most of a short request's first audio.
The continuous batch prefills its groups here.

It is the lean frame step (morph/decode/lean.py stack_step) over every slot of the prompt, and follows upstream's
forward exactly where it decides something: a row's token i (i >= its left padding p) sits at rotary position i - p,
as the talker's get_rope_index gives a text-only prompt, and attends to its own tokens p..i. Attention is spelled out
(morph/masked_attention.py says why) where upstream's default runs torch's scaled_dot_product_attention: the same sums,
the softmax in float32; the residual stream is kept in fp32, so the prompt and the frames after it round alike. Pad
tokens attend to their own slot only: what they compute is never read (every real token's bound hides it), but it
stays finite.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .lean import Dims, LayerW, stack_step


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
    pads = length - attention_mask.sum(-1).to(torch.long)  # [rows]
    slots = torch.arange(length, device=inputs_embeds.device)
    positions = (slots.unsqueeze(0) - pads.unsqueeze(1)).clamp(min=0)  # [rows, L]
    kv = into if into is not None else [tuple(norm_w.new_empty(rows, d.kv_heads, length, d.head_dim) for _ in "kv") for _ in weights]
    # the frame step's layers over every slot of the prompt, causal from each row's first token
    x = stack_step(inputs_embeds, weights, norm_w, [k for k, _ in kv], [v for _, v in kv], cos_table, sin_table,
                   positions, slots, pads, d)
    last = x[:, -1:]  # [rows, 1, hidden]
    return Prefilled(kv, F.linear(last[:, -1], head_w), last)
