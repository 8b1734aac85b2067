"""The pack's one attention in torch, under an explicit mask: the lean frame step's and the prefill's over the key/value
cache (morph/decode/lean.py, a paged cache gathered first) and the codec's window over a chunk (morph/codec/layers.py).
The fused mode's Triton kernel (morph/kernels/attention.py) is tested against it.

Spelled out rather than torch's scaled_dot_product_attention: every caller brings a new shape with almost every call
(a live chunk's rows and frames, a request's prompt), and under the server's load that call would hold a large share
of the live engine's thread in the codec and slow a lone request's prefill (py-spy, bench/results/h100-2026-11-25c);
spelled out it is a few kernels whose cost follows the shape.
"""

from __future__ import annotations

import torch

# The scores of one call are kept under this many bytes (float32): a prefill group of 64 rows with 1,023-token prompts
# would otherwise hold 4 GiB of them at the 0.6B dims; rows are taken in turn instead.
SCORES_BYTES = 256 * 2**20


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [B, H, n, D] over k, v [B, KV, S, D] where `allowed` [B or 1, 1, n, S] is True -> [B, n, H * D].

    Query heads j*G .. j*G+G-1 share KV head j (HF's repeat_kv): a KV head's query heads are folded into its query
    rows, so its keys are never repeated. The scores and the softmax are float32, from the inputs upcast (as upstream's
    sdpa kernels keep them: scores rounded to bf16 move the lean step's bf16 logits measurably further from the fp32
    reference, bench/numerics.py). A masked score is float32's lowest, not -inf: a query allowed no key (a free slot of
    the continuous batch, its bound past its position) averages the values instead of giving NaN, which would reach
    the keys and values a later row in that slot reads.
    """
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
