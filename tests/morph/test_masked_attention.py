"""morph/masked_attention.py: torch's scaled_dot_product_attention under the same mask, grouped query heads
included, for a prompt's many queries and a decode step's one; the same when the rows are taken in turn to bound the
scores' memory; a query allowed no key averages the values instead of giving NaN."""

import pytest
import torch
import torch.nn.functional as F

from morph import masked_attention as ma


def _case(rows=3, heads=4, kv=2, n=5, s=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, h, t, d, generator=g) for h, t in ((heads, n), (kv, s), (kv, s)))
    allowed = torch.rand(rows, 1, n, s, generator=g) > 0.4
    allowed[..., -1] = True  # every query sees a key
    return q, k, v, allowed


def _sdpa(q, k, v, allowed, scale):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


@pytest.mark.parametrize("n", [5, 1])
def test_it_is_sdpa_under_the_same_mask_with_grouped_heads(n):
    q, k, v, allowed = _case(n=n)
    torch.testing.assert_close(ma.masked_attention(q, k, v, allowed, 0.3), _sdpa(q, k, v, allowed, 0.3),
                               rtol=1e-5, atol=1e-6)
    # a query head reads its own KV head: heads 0-1 read KV head 0, heads 2-3 KV head 1
    k2 = k.clone()
    k2[:, 1] += 1
    changed = ma.masked_attention(q, k2, v, allowed, 0.3) != ma.masked_attention(q, k, v, allowed, 0.3)
    changed = changed.view(3, n, 4, 8)  # [rows, n, heads, D]
    assert not changed[:, :, :2].any() and changed[:, :, 2:].any()


def test_rows_taken_in_turn_give_the_same_and_a_shared_mask_broadcasts(monkeypatch):
    q, k, v, allowed = _case(rows=5)
    whole = ma.masked_attention(q, k, v, allowed, 0.5)
    shared = ma.masked_attention(q, k, v, allowed[:1], 0.5)
    monkeypatch.setattr(ma, "SCORES_BYTES", 2 * 4 * 5 * 9 * 4)  # two rows' scores a call
    torch.testing.assert_close(ma.masked_attention(q, k, v, allowed, 0.5), whole, rtol=0, atol=0)
    torch.testing.assert_close(ma.masked_attention(q, k, v, allowed[:1], 0.5), shared, rtol=0, atol=0)
    torch.testing.assert_close(shared, _sdpa(q, k, v, allowed[:1], 0.5), rtol=1e-5, atol=1e-6)


def test_a_query_allowed_no_key_averages_the_values():
    """A free slot of the continuous batch (its bound past its position) sees no key: its output is finite, and the
    other rows' are what they would be without it."""
    q, k, v, allowed = _case()
    want = ma.masked_attention(q, k, v, allowed, 0.3)
    allowed[1] = False
    got = ma.masked_attention(q, k, v, allowed, 0.3)
    mean = v[1].mean(1).repeat_interleave(2, 0).reshape(1, -1)  # each query head its KV head's mean
    torch.testing.assert_close(got[1], mean.expand(5, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[[0, 2]], want[[0, 2]], rtol=0, atol=0)
