"""morph/masked_attention.py: torch's scaled_dot_product_attention under the same mask, grouped query heads
included, and the same when the rows are taken in turn to bound the scores' memory."""

import torch
import torch.nn.functional as F

from morph import masked_attention as ma


def _case(rows=3, heads=4, kv=2, n=5, s=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, h, t, d, generator=g) for h, t in ((heads, n), (kv, s), (kv, s)))
    allowed = torch.rand(rows, 1, n, s, generator=g) > 0.4
    allowed[..., -1] = True  # every query sees a key
    return q, k, v, allowed


def test_it_is_sdpa_under_the_same_mask_with_grouped_heads():
    q, k, v, allowed = _case()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(ma.masked_attention(q, k, v, allowed, 0.3), want, rtol=1e-5, atol=1e-6)
    # a query head reads its own KV head: heads 0-1 read KV head 0, heads 2-3 KV head 1
    k2 = k.clone()
    k2[:, 1] += 1
    changed = ma.masked_attention(q, k2, v, allowed, 0.3) != ma.masked_attention(q, k, v, allowed, 0.3)
    assert not changed[:, :2].any() and changed[:, 2:].any()


def test_rows_taken_in_turn_give_the_same_and_a_shared_mask_broadcasts(monkeypatch):
    q, k, v, allowed = _case(rows=5)
    whole = ma.masked_attention(q, k, v, allowed, 0.5)
    shared = ma.masked_attention(q, k, v, allowed[:1], 0.5)
    monkeypatch.setattr(ma, "SCORES_BYTES", 2 * 4 * 5 * 9 * 4)  # two rows' scores a call
    torch.testing.assert_close(ma.masked_attention(q, k, v, allowed, 0.5), whole, rtol=0, atol=0)
    torch.testing.assert_close(ma.masked_attention(q, k, v, allowed[:1], 0.5), shared, rtol=0, atol=0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:1], scale=0.5, enable_gqa=True)
    torch.testing.assert_close(shared, want, rtol=1e-5, atol=1e-6)
