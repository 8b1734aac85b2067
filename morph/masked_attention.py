"""The pack's one attention in torch, under an explicit mask (lean step, prefill, codec window); the fused Triton kernel
is tested against it. Not sdpa: its host cost for a new shape at almost every call held the live engine's thread."""

from __future__ import annotations

import torch

# The scores of one call are kept under this many bytes (float32): a wide prefill group takes its rows in turn.
SCORES_BYTES = 256 * 2**20


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [B, H, n, D] over k, v [B, KV, S, D] where `allowed` [B or 1, 1, n, S] is True -> [B, n, H * D], a KV head's
    query heads folded into its rows (keys never repeated), scores and softmax in float32 as upstream's sdpa. A masked
    score is float32's lowest, not -inf: a query allowed no key (a free slot) leaves no NaN for the slot's next row."""
    b, h, n, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    per = max(1, SCORES_BYTES // (h * n * s * 4))
    if b > per:
        return torch.cat([masked_attention(q[i:i + per], k[i:i + per], v[i:i + per],
                                           allowed[i:i + per] if allowed.shape[0] > 1 else allowed, scale)
                          for i in range(0, b, per)])
    qg = q.reshape(b, kv, h // kv * n, d)
    scores = torch.matmul(qg.float(), k.transpose(-1, -2).float()) * scale  # [B, KV, G * n, S]
    scores = scores.view(b, kv, h // kv, n, s).masked_fill(~allowed.unsqueeze(2), torch.finfo(torch.float32).min)
    out = torch.matmul(scores.view(b, kv, h // kv * n, s).softmax(-1).to(v.dtype), v)  # [B, KV, G * n, D]
    return out.view(b, h, n, d).transpose(1, 2).reshape(b, n, h * d)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding as HF applies it before attention: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
