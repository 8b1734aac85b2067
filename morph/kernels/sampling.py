"""The code sampler of mode "fused": sampling.pick's sampled draw in three kernels instead of about nine, with the
same math, order and random numbers as morph/decode/sampling.py, so a seeded run draws the same tokens."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..settings import Sampling
from .kth import kth_largest_in_row
from .common import TL_DTYPES, as_ptr


@triton.jit
def _warp_softmax_kernel(x_addr, o_addr, V, temperature, k, X_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """HF's warpers for one row, then softmax in fp32: scores / temperature, all below the k-th largest to -inf."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < V
    x = tl.load(as_ptr(x_addr, X_DTYPE) + row * V + cols, mask=ok, other=float("-inf")).to(tl.float32) / temperature
    x = tl.where(x < kth_largest_in_row(x, ok, k), float("-inf"), x)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(as_ptr(o_addr, tl.float32) + row * V + cols, e / tl.sum(e, axis=0), mask=ok)


@triton.jit
def _race_kernel(p_addr, q_addr, o_addr, V, BLOCK: tl.constexpr):
    """argmax(p / q) of one row: sampling.draw's exponential race (first index on ties). A NaN ranks above every number,
    as in torch.argmax: below the padding lanes, a NaN row would pick an index past the vocabulary (a device assert)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < V
    p = tl.load(as_ptr(p_addr, tl.float32) + row * V + cols, mask=ok, other=0.0)
    q = tl.load(as_ptr(q_addr, tl.float32) + row * V + cols, mask=ok, other=1.0)
    r = p / q
    r = tl.where(r != r, float("inf"), r)
    tl.store(as_ptr(o_addr, tl.int64) + row, tl.argmax(tl.where(ok, r, -1.0), axis=0).to(tl.int64))


def sample_warped(scores: torch.Tensor, s: Sampling, noise, slot: int = 0) -> torch.Tensor:
    """sampling.pick for a sampled draw without top-p (sampling.fused_pick says when), Exp(1) values from `noise`."""
    v = scores.shape[-1]
    flat = scores.reshape(-1, v).contiguous()
    probs = torch.empty(flat.shape, device=flat.device, dtype=torch.float32)
    block = triton.next_power_of_2(v)
    warps = 4 if block <= 2048 else 8
    k = min(int(s.top_k), v) if s.top_k and s.top_k > 0 else v
    _warp_softmax_kernel[(flat.shape[0],)](flat.data_ptr(), probs.data_ptr(), v, float(s.temperature), k,
                                           X_DTYPE=TL_DTYPES[flat.dtype], BLOCK=block, num_warps=warps)
    race = noise(probs.view(scores.shape), slot).reshape(probs.shape).contiguous()
    out = torch.empty(flat.shape[0], device=flat.device, dtype=torch.long)
    _race_kernel[(flat.shape[0],)](probs.data_ptr(), race.data_ptr(), out.data_ptr(), v, BLOCK=block, num_warps=warps)
    return out.reshape(scores.shape[:-1])
