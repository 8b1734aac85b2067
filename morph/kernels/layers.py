"""Fused Triton kernels for the lean decode step (mode "fused"): at decode sizes a layer costs its launches, not its
arithmetic, so a layer here is five: RMSNorm + qkv, attention (attention.py), o + residual, norm + SiLU(gate) * up,
down + residual, in HF's order of upcasts and roundings with fp32 accumulation (in bf16 lean.py rounds less)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import triton
import triton.language as tl

from .attention import attention
from .common import TL_DTYPES, _weighted, as_ptr


@triton.jit
def _linear_kernel(x_addr, w_addr, nw_addr, r_addr, o_addr, M, N, eps, K: tl.constexpr,
                   DTYPE: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr, SILU: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[M, N] = epilogue(norm(x)[M, K] @ w[N, K]^T) for M <= gemv_rows(w), on CUDA cores; with SILU, w holds gate
    rows then up rows. Narrow column blocks spread the weight stream over every SM."""
    x, w, o = as_ptr(x_addr, DTYPE), as_ptr(w_addr, DTYPE), as_ptr(o_addr, DTYPE)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    if NORM:
        sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x + rm[:, None] * K + rk[None, :], mask=m_ok[:, None] & (rk < K)[None, :], other=0.0)
            xv = xv.to(tl.float32)
            sq += tl.sum(xv * xv, axis=1)
        rstd = tl.rsqrt(sq / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        xv = tl.load(x + rm[:, None] * K + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            nw = tl.load(as_ptr(nw_addr, DTYPE) + rk, mask=k_ok, other=0.0)
            xv = _weighted(xv.to(tl.float32) * rstd[:, None], nw[None, :], DTYPE)
        wv = tl.load(w + rn[:, None] * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(xv[:, None, :].to(tl.float32) * wv[None, :, :].to(tl.float32), axis=2)
        if SILU:
            wu = tl.load(w + (rn[:, None] + N) * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc_up += tl.sum(xv[:, None, :].to(tl.float32) * wu[None, :, :].to(tl.float32), axis=2)
    y = acc.to(DTYPE)
    if SILU:  # HF: act_fn(gate_proj(x)) * up_proj(x), each result rounded to the model dtype
        g = y.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(DTYPE)
        y = (s.to(tl.float32) * acc_up.to(DTYPE).to(tl.float32)).to(DTYPE)
    out_off = rm[:, None] * N + rn[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if RESIDUAL:
        r = tl.load(as_ptr(r_addr, DTYPE) + out_off, mask=out_ok, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(DTYPE)
    tl.store(o + out_off, y, mask=out_ok)


@triton.jit
def _rms_norm_kernel(x_addr, w_addr, o_addr, N, eps, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(as_ptr(x_addr, DTYPE) + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(as_ptr(w_addr, DTYPE) + cols, mask=ok, other=0.0)
    y = _weighted(x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps), w, DTYPE)
    tl.store(as_ptr(o_addr, DTYPE) + row * N + cols, y, mask=ok)


def gemv_rows(w: torch.Tensor) -> int:
    """Rows up to which these kernels beat cuBLAS on `w` (bench/results/h200-2026-11-28f/NOTES.md); wider, cuBLAS."""
    return 4 if w.numel() < 2**23 else 2


def _config(m: int, n: int, k: int) -> dict:
    """Tile sizes from sweeps at the decode shapes, weights cold (bench/results/h200-2026-11-28f/NOTES.md)."""
    return dict(BLOCK_M=triton.next_power_of_2(m), BLOCK_N=8 if n >= 4096 else 4,
                BLOCK_K=min(triton.next_power_of_2(k), 1024), num_warps=4, num_stages=2)


def linear(x: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor | None = None, eps: float = 0.0,
           residual: torch.Tensor | None = None, silu: bool = False) -> torch.Tensor:
    """x [M, K] (contiguous) @ w[N, K]^T with an optional RMSNorm of x before, SiLU(gate) * up over w's two halves, or
    a residual [M, N] added after; returns [M, N] (N halved with silu)."""
    m, k = x.shape
    if m > gemv_rows(w):
        if norm_w is not None:
            x = rms_norm(x, norm_w, eps)
        if silu:
            gate, up = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.linear(x, w) if residual is None else torch.addmm(residual, x, w.t())
    n = w.shape[0] // 2 if silu else w.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    cfg = _config(m, n, k)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
    _linear_kernel[grid](x.data_ptr(), w.data_ptr(), norm_w.data_ptr() if norm_w is not None else 0,
                         residual.data_ptr() if residual is not None else 0, out.data_ptr(), m, n, eps, K=k,
                         DTYPE=TL_DTYPES[x.dtype], NORM=norm_w is not None, RESIDUAL=residual is not None,
                         SILU=silu, **cfg)
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    out = torch.empty_like(x)
    _rms_norm_kernel[(x.numel() // n,)](x.data_ptr(), w.data_ptr(), out.data_ptr(), n, eps, DTYPE=TL_DTYPES[x.dtype],
                                        BLOCK=triton.next_power_of_2(n), num_warps=4)
    return out


def stack_step(x, weights, norm_w, k_caches, v_caches, cos_table, sin_table, rope_pos, write_idx, lo, d, table=None):
    """lean.stack_step's contract in five kernels a layer; with `table`, the caches are page pools (attention)."""
    b, t, hidden = x.shape
    h = x.reshape(b * t, hidden).contiguous()
    for w, kc, vc in zip(weights, k_caches, v_caches, strict=True):
        qkv = linear(h, w.wqkv, norm_w=w.ln1, eps=d.eps)
        attn = attention(qkv, kc, vc, w.q_norm, w.k_norm, cos_table, sin_table, rope_pos, write_idx, lo, d, table=table)
        h = linear(attn, w.wo, residual=h)
        h = linear(linear(h, w.wgu, norm_w=w.ln2, eps=d.eps, silu=True), w.wd, residual=h)
    return rms_norm(h, norm_w, d.eps).view(b, t, hidden)
