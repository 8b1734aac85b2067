"""Attention under an explicit mask, spelled out in torch: the codec's window over a chunk (morph/codec/layers.py)
and a prompt group's prefill (morph/decode/prefill.py).

Both used to call scaled_dot_product_attention with a boolean mask, and both bring a new shape with almost every call
(rows and frames of a live chunk, the prompt's length of a request). On an H100, under the speech server's load, that
call held a third of the live engine's thread in the codec (py-spy, bench/results/h100-2026-11-25c), and a lone
request's prefill took 22 to 34 ms at the 0.6B dims. Spelled out it is a few kernels whose cost follows the shape,
with the softmax in float32.
"""

from __future__ import annotations

import torch

# The scores of one call are kept under this many bytes (float32): a prefill group of 64 rows with 1,023-token prompts
# would otherwise hold 4 GiB of them at the 0.6B dims; rows are taken in turn instead.
SCORES_BYTES = 256 * 2**20


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q [B, H, n, D] over k, v [B, KV, S, D] (H a multiple of KV: each KV head serves H / KV query heads) where
    `allowed` [B or 1, 1, n, S] is True -> [B, H, n, D]. Every query must be allowed at least one key."""
    b, h, n, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    per = max(1, SCORES_BYTES // (h * n * s * 4))
    if b > per:
        return torch.cat([masked_attention(q[i:i + per], k[i:i + per], v[i:i + per],
                                           allowed[i:i + per] if allowed.shape[0] > 1 else allowed, scale)
                          for i in range(0, b, per)])
    qg = q.reshape(b, kv, h // kv, n, d)  # a KV head's query heads together: no copy of its keys per query head
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)).float() * scale  # [B, KV, H / KV, n, S]
    scores = scores.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(v.dtype), v.unsqueeze(2))
    return out.view(b, h, n, d)
