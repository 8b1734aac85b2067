"""Lean decoder layers for the talker's and code predictor's decode steps, and a prompt's prefill on them. `stack_step`
runs a whole stack over static KV buffers at fixed shapes, so one CUDA graph replays at every position: as it is
("lean"), captured ("graphs") or as Triton kernels ("fused", morph/kernels/layers.py). In fp32 it is HF's math op for
op; in bf16 the residual stream and attention scores stay fp32, or it would drift as far as upstream's bf16, or more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..masked_attention import masked_attention, rotate
from . import kv_store


class LayerW(NamedTuple):
    """One decoder layer's weights (views of the module's own parameters)."""

    ln1: torch.Tensor
    wqkv: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, hidden]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    wo: torch.Tensor
    ln2: torch.Tensor
    wgu: torch.Tensor  # [2 * intermediate, hidden]
    wd: torch.Tensor


@dataclass(frozen=True)
class Dims:
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


class LeanUnsupported(RuntimeError):
    """The checkpoint's layers use something the lean path does not implement."""


def dims_of(config) -> Dims:
    if getattr(config, "hidden_act", "silu") != "silu":
        raise LeanUnsupported(f"hidden_act {config.hidden_act!r} (lean layers implement silu)")
    if getattr(config, "attention_bias", False):
        raise LeanUnsupported("attention_bias=True (lean layers fuse bias-free projections)")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise LeanUnsupported("sliding-window attention")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return Dims(config.num_attention_heads, config.num_key_value_heads, head_dim, config.intermediate_size,
                float(config.rms_norm_eps))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm, rounding the normed row to the weight's dtype rather than x's (x may be the fp32 residual)."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(weight.dtype)


def stack_step(x: torch.Tensor, weights: list[LayerW], norm_w: torch.Tensor, k_caches: list[torch.Tensor],
               v_caches: list[torch.Tensor], cos_table: torch.Tensor, sin_table: torch.Tensor, rope_pos: torch.Tensor,
               write_idx: torch.Tensor, lo: torch.Tensor, d: Dims, table: torch.Tensor | None = None) -> torch.Tensor:
    """All layers plus the final norm over T new positions a row. rope_pos [B, T] indexes the [L, D] cos/sin tables;
    K/V go to slots write_idx [T]; row b's token t attends to slots lo[b] .. write_idx[t] (a token below lo[b] to its
    own slot alone, so it stays finite). With a page `table` the caches are paged pools (kv_store.py)."""
    x = x.to(torch.float32)  # the residual stream, rounded only where a layer reads it (rms_norm)
    cos, sin = cos_table[rope_pos].unsqueeze(1), sin_table[rope_pos].unsqueeze(1)  # [B, 1, T, D]
    slots = torch.arange(k_caches[0].shape[2] if table is None else table.shape[1] * k_caches[0].shape[2],
                         device=x.device)
    last = write_idx.unsqueeze(1)
    allowed = (((slots <= last) & (slots >= lo.view(-1, 1, 1))) | (slots == last)).unsqueeze(1)  # [B, 1, T, L]
    where = None if table is None else kv_store.place(table, write_idx, k_caches[0].shape[2])  # every layer's
    b, t, _ = x.shape
    for w, kc, vc in zip(weights, k_caches, v_caches, strict=True):
        q, k, v = F.linear(rms_norm(x, w.ln1, d.eps), w.wqkv).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
        q = rotate(rms_norm(q.view(b, t, d.heads, d.head_dim), w.q_norm, d.eps).transpose(1, 2), cos, sin)
        k = rotate(rms_norm(k.view(b, t, d.kv_heads, d.head_dim), w.k_norm, d.eps).transpose(1, 2), cos, sin)
        v = v.view(b, t, d.kv_heads, d.head_dim).transpose(1, 2)
        if table is None:
            kc.index_copy_(2, write_idx, k)
            vc.index_copy_(2, write_idx, v)
        else:
            kv_store.put(kc, *where, k)
            kv_store.put(vc, *where, v)
            kc, vc = kv_store.gather(kc, table), kv_store.gather(vc, table)
        x = x + F.linear(masked_attention(q, kc, vc, allowed, d.scale), w.wo)
        gate, up = F.linear(rms_norm(x, w.ln2, d.eps), w.wgu).split([d.intermediate, d.intermediate], dim=-1)
        x = x + F.linear(F.silu(gate) * up, w.wd)
    return rms_norm(x, norm_w, d.eps)


class Prefilled(NamedTuple):
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [rows, kv_heads, L, D]
    logits: torch.Tensor  # [rows, vocab]: the last position's
    past_hidden: torch.Tensor  # [rows, 1, hidden]: the last position's hidden state, normed


def lean_prefill(inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, weights: list[LayerW],
                 norm_w: torch.Tensor, head_w: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                 d: Dims, into: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Prefilled:
    """Upstream's talker forward over a left-padded prompt batch [rows, L, hidden], run as the frame step over every
    slot so the prompt and its frames round alike, without HF's per-call host work; token i of a row padded p sits at
    rotary position i - p, as upstream. `into`: per layer (keys, values) to write into (prefill_graphs.py's)."""
    rows, length, _ = inputs_embeds.shape
    pads = length - attention_mask.sum(-1).to(torch.long)  # [rows]
    slots = torch.arange(length, device=inputs_embeds.device)
    positions = (slots.unsqueeze(0) - pads.unsqueeze(1)).clamp(min=0)  # [rows, L]
    if into is None:
        into = [tuple(norm_w.new_empty(rows, d.kv_heads, length, d.head_dim) for _ in "kv") for _ in weights]
    x = stack_step(inputs_embeds, weights, norm_w, [k for k, _ in into], [v for _, v in into], cos_table, sin_table,
                   positions, slots, pads, d)
    last = x[:, -1:]  # [rows, 1, hidden]
    return Prefilled(into, F.linear(last[:, -1], head_w), last)


def _stack_step(fused: bool):
    if fused:  # Triton is imported only when the fused mode runs (morph/decode/runner.py checks for it)
        from ..kernels.layers import stack_step as fused_step
        return fused_step
    return stack_step


def predictor_pass(x: torch.Tensor, proj_w: torch.Tensor | None, proj_b: torch.Tensor | None,
                   weights: list[LayerW], norm_w: torch.Tensor, k_caches: list[torch.Tensor],
                   v_caches: list[torch.Tensor], cos_table: torch.Tensor, sin_table: torch.Tensor,
                   write_idx: torch.Tensor, lo: torch.Tensor, d: Dims, fused: bool = False) -> torch.Tensor:
    """A code-predictor pass: projection, then the stack at positions `write_idx` [T], causal (lo is zeros)."""
    if proj_w is not None:
        x = F.linear(x, proj_w, proj_b)
    rope_pos = write_idx.unsqueeze(0).expand(x.shape[0], -1)
    return _stack_step(fused)(x, weights, norm_w, k_caches, v_caches, cos_table, sin_table, rope_pos, write_idx, lo, d)


def talker_pass(x: torch.Tensor, weights: list[LayerW], norm_w: torch.Tensor, k_caches: list[torch.Tensor],
                v_caches: list[torch.Tensor], cos_table: torch.Tensor, sin_table: torch.Tensor,
                cache_pos: torch.Tensor, rope_pos: torch.Tensor, pads: torch.Tensor, d: Dims,
                fused: bool = False, table: torch.Tensor | None = None) -> torch.Tensor:
    """A talker one-token step at slot `cache_pos` [1]: row b at rotary position rope_pos[b], left-padded pads[b]."""
    return _stack_step(fused)(x, weights, norm_w, k_caches, v_caches, cos_table, sin_table, rope_pos.unsqueeze(1),
                              cache_pos, pads, d, table=table)


def rope_tables(rotary_emb: torch.nn.Module, length: int, device, dtype, multimodal: bool):
    """cos/sin [length, D] from the model's own rotary module, so values are HF's exactly (multimodal: the talker's)."""
    positions = torch.arange(length, device=device).unsqueeze(0)
    if multimodal:
        positions = positions.unsqueeze(0).expand(3, 1, -1)
    cos, sin = rotary_emb(torch.zeros(1, device=device, dtype=dtype), positions)
    if multimodal:
        cos, sin = cos[0], sin[0]
    return cos[0].contiguous(), sin[0].contiguous()
