"""Fused Triton kernels for the lean decode step (mode "fused").

At decode sizes (one token per row, hidden 1024-2048) a layer's cost is the number of
kernels it launches, not its arithmetic: the lean layer in plain torch ops is about 45
kernels, and a frame at seq_groups 15 runs 103 layers. Here a layer is five kernels:

    qkv   = linear(x, wqkv, norm=ln1)                 RMSNorm fused into the GEMV
    attn  = attention(qkv, caches, ...)               q/k norm, RoPE, cache write, attention
    x     = linear(attn, wo, residual=x)              residual add fused
    act   = linear(x, wgu, norm=ln2, silu=True)       gate and up, SiLU(gate) * up fused
    x     = linear(act, wd, residual=x)

The math follows HF's order of upcasts and roundings (fp32 variance, the normed row rounded
to the model dtype before the weight multiply, bf16 RoPE products, the residual stream in the
model dtype), with fp32 accumulation throughout; in fp32 the results equal lean's to
rounding. (In bf16 morph/decode/lean.py rounds less: its residual stream is fp32.)

Kernels compile in about a second each on first use and land in Triton's disk cache, so
a new process starts in seconds. Like morph/kernels/kth.py they take addresses, not tensors:
under cudaMallocAsync, Triton's launcher refuses tensors allocated during a CUDA graph
capture, which is where every activation here is allocated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import triton
import triton.language as tl


TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def as_ptr(addr, dtype: tl.constexpr):
    return addr.to(tl.pointer_type(dtype))


@triton.jit
def _weighted(normed, w, DTYPE: tl.constexpr):
    """HF RMSNorm's last step: weight * normed.to(dtype), the product rounded to the model dtype."""
    return (w.to(tl.float32) * normed.to(DTYPE).to(tl.float32)).to(DTYPE)


@triton.jit
def _linear_kernel(x_addr, w_addr, nw_addr, r_addr, o_addr, M, N, eps, K: tl.constexpr,
                   DTYPE: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr, SILU: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[M, N] = epilogue(norm(x)[M, K] @ w[N, K]^T) for M <= GEMV_ROWS, on CUDA cores; with
    SILU, w holds gate rows then up rows. Narrow column blocks spread the weight stream over
    every SM."""
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
def _dot(a, b, acc, DTYPE: tl.constexpr):
    """acc + a @ b^T; fp32 inputs multiply in full fp32 (Triton would use TF32)."""
    if DTYPE == tl.float32:
        return tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(b), acc)


@triton.jit
def _norm_rope(x, x_rot, w, w_rot, sign, cos, sin, eps, D: tl.constexpr, DTYPE: tl.constexpr):
    """Per-head RMSNorm, then RoPE, of rows x [R, D]; x_rot/w_rot are x and w at the
    rotate_half positions, sign is -1 on the first half (HF: q * cos + rotate_half(q) * sin)."""
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
    xn = _weighted(xf * rstd, w[None, :], DTYPE)
    xr = _weighted(x_rot.to(tl.float32) * rstd, w_rot[None, :], DTYPE)
    a = (xn.to(tl.float32) * cos.to(tl.float32)).to(DTYPE)
    b = ((sign[None, :] * xr.to(tl.float32)) * sin.to(tl.float32)).to(DTYPE)
    return (a.to(tl.float32) + b.to(tl.float32)).to(DTYPE)


@triton.jit
def _attention_kernel(qkv_addr, o_addr, kc_addr, vc_addr, qn_addr, kn_addr, cos_addr, sin_addr, pos_addr, slot_addr,
                      lo_addr, pos_sb, pos_st, eps, scale, L: tl.constexpr,
                      H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, T: tl.constexpr, TP: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK_L: tl.constexpr, DTYPE: tl.constexpr):
    """One (batch row, kv head): the T new tokens' K/V into the cache at their slots, then
    the G = H / KVH query heads of that kv head attend over slots lo[b] .. their own slot."""
    b, h = tl.program_id(0), tl.program_id(1)
    G: tl.constexpr = H // KVH
    width: tl.constexpr = (H + 2 * KVH) * D
    qkv, kc, vc = as_ptr(qkv_addr, DTYPE), as_ptr(kc_addr, DTYPE), as_ptr(vc_addr, DTYPE)
    cos_t, sin_t = as_ptr(cos_addr, DTYPE), as_ptr(sin_addr, DTYPE)
    pos_p, slot_p = as_ptr(pos_addr, tl.int64), as_ptr(slot_addr, tl.int64)
    d = tl.arange(0, D)
    d_rot = (d + D // 2) % D
    sign = tl.where(d < D // 2, -1.0, 1.0)
    cache = (b * KVH + h) * L * D

    # the new keys (normed, rotated) and values, written at their slots
    t = tl.arange(0, TP)
    t_ok = t < T
    row = (b * T + t)[:, None] * width
    kn, kn_rot = tl.load(as_ptr(kn_addr, DTYPE) + d), tl.load(as_ptr(kn_addr, DTYPE) + d_rot)
    pos = tl.load(pos_p + b * pos_sb + t * pos_st, mask=t_ok, other=0)[:, None] * D
    k_col = (H + h) * D
    k = tl.load(qkv + row + k_col + d[None, :], mask=t_ok[:, None], other=0.0)
    k_rot = tl.load(qkv + row + k_col + d_rot[None, :], mask=t_ok[:, None], other=0.0)
    k = _norm_rope(k, k_rot, kn, kn_rot, sign, tl.load(cos_t + pos + d[None, :]), tl.load(sin_t + pos + d[None, :]),
                   eps, D, DTYPE)
    v = tl.load(qkv + row + (H + KVH + h) * D + d[None, :], mask=t_ok[:, None], other=0.0)
    slot = tl.load(slot_p + t, mask=t_ok, other=0)[:, None] * D
    tl.store(kc + cache + slot + d[None, :], k, mask=t_ok[:, None])
    tl.store(vc + cache + slot + d[None, :], v, mask=t_ok[:, None])
    tl.debug_barrier()  # the writes above are read back below by other threads of this program

    # query rows r = g * T + t: head h * G + g at token t (rows past G * T are padding)
    r = tl.arange(0, ROWS)
    r_ok = r < G * T
    tq = r % T
    q_off = ((b * T + tq) * width + (h * G + r // T) * D)[:, None]
    qn, qn_rot = tl.load(as_ptr(qn_addr, DTYPE) + d), tl.load(as_ptr(qn_addr, DTYPE) + d_rot)
    pos = tl.load(pos_p + b * pos_sb + tq * pos_st)[:, None] * D
    q = tl.load(qkv + q_off + d[None, :], mask=r_ok[:, None], other=0.0)
    q_rot = tl.load(qkv + q_off + d_rot[None, :], mask=r_ok[:, None], other=0.0)
    q = _norm_rope(q, q_rot, qn, qn_rot, sign, tl.load(cos_t + pos + d[None, :]), tl.load(sin_t + pos + d[None, :]),
                   eps, D, DTYPE)
    last = tl.load(slot_p + tq)  # each row sees slots up to its own token's
    lo = tl.load(as_ptr(lo_addr, tl.int64) + b)
    hi = tl.load(slot_p + T - 1) + 1
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, D], dtype=tl.float32)
    # The cache length is a compile-time constant and blocks outside lo .. hi are skipped,
    # rather than a loop over lo .. hi: loop bounds read from memory break Triton's CPU
    # interpreter, which the CPU tests use.
    for s0 in range(0, L, BLOCK_L):
        if (s0 < hi) & (s0 + BLOCK_L > lo):
            s = s0 + tl.arange(0, BLOCK_L)
            kv_off = cache + s[:, None] * D + d[None, :]
            kb = tl.load(kc + kv_off, mask=(s < hi)[:, None], other=0.0)
            scores = _dot(q, kb, tl.zeros([ROWS, BLOCK_L], dtype=tl.float32), DTYPE) * scale
            valid = (s[None, :] >= lo) & (s[None, :] <= last[:, None])
            scores = tl.where(valid, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # finite: the first block visited holds slot lo
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vb = tl.load(vc + kv_off, mask=(s < hi)[:, None], other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(DTYPE), tl.trans(vb), tl.zeros([ROWS, D], dtype=tl.float32),
                                              DTYPE)
            m_i = m_new
    out = (acc / l_i[:, None]).to(DTYPE)
    o_off = ((b * T + tq) * (H * D) + (h * G + r // T) * D)[:, None]
    tl.store(as_ptr(o_addr, DTYPE) + o_off + d[None, :], out, mask=r_ok[:, None])


@triton.jit
def _rms_norm_kernel(x_addr, w_addr, o_addr, N, eps, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(as_ptr(x_addr, DTYPE) + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(as_ptr(w_addr, DTYPE) + cols, mask=ok, other=0.0)
    y = _weighted(x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps), w, DTYPE)
    tl.store(as_ptr(o_addr, DTYPE) + row * N + cols, y, mask=ok)


# -- launchers ---------------------------------------------------------------------------
GEMV_ROWS = 4  # above this many rows (batched decoding), cuBLAS GEMMs beat these kernels


def _config(m: int, n: int, k: int) -> dict:
    """Tile sizes from a sweep on an H100 at the 0.6B decode shapes, weights read cold from
    memory (bench/results/h100-2026-11-22b/sweep.json): 4-8 columns per program and K up to
    1024 per loop step were best for 1 and 2 rows."""
    rows = triton.next_power_of_2(m)
    block_k = min(triton.next_power_of_2(k), 1024 if rows <= 2 else 512)
    return dict(BLOCK_M=rows, BLOCK_N=8 if n >= 4096 else 4, BLOCK_K=block_k, num_warps=4, num_stages=2)


def linear(x: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor | None = None, eps: float = 0.0,
           residual: torch.Tensor | None = None, silu: bool = False) -> torch.Tensor:
    """x [M, K] (contiguous) @ w[N, K]^T with an optional RMSNorm of x before, SiLU(gate) * up
    over w's two halves, or a residual [M, N] added after; returns [M, N] (N halved with silu)."""
    m, k = x.shape
    if m > GEMV_ROWS:
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


def attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_norm: torch.Tensor,
              k_norm: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, rope_pos: torch.Tensor,
              write_idx: torch.Tensor, lo: torch.Tensor, d) -> torch.Tensor:
    """qkv [B*T, (H + 2 KVH) D] -> attention output [B*T, H D]; writes the new K/V into the
    caches [B, KVH, L, D] at write_idx [T]. rope_pos [B, T] indexes the [*, D] cos/sin tables;
    row b attends to slots lo[b] .. (its token's slot)."""
    b, _, length, hd = k_cache.shape
    t = write_idx.shape[0]
    out = torch.empty(qkv.shape[0], d.q_size, device=qkv.device, dtype=qkv.dtype)
    rows = max(16, triton.next_power_of_2(d.heads // d.kv_heads * t))
    # measured (same sweep as _config): the talker's long caches want wide blocks and 8 warps
    block_l, warps = (16, 4) if length <= 16 else (128, 8)
    _attention_kernel[(b, d.kv_heads)](
        qkv.data_ptr(), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), q_norm.data_ptr(), k_norm.data_ptr(),
        cos_table.data_ptr(), sin_table.data_ptr(), rope_pos.data_ptr(), write_idx.data_ptr(), lo.data_ptr(),
        rope_pos.stride(0), rope_pos.stride(1), d.eps, d.scale, L=length,
        H=d.heads, KVH=d.kv_heads, D=hd, T=t, TP=triton.next_power_of_2(t), ROWS=rows, BLOCK_L=block_l,
        DTYPE=TL_DTYPES[qkv.dtype], num_warps=warps)
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    out = torch.empty_like(x)
    _rms_norm_kernel[(x.numel() // n,)](x.data_ptr(), w.data_ptr(), out.data_ptr(), n, eps, DTYPE=TL_DTYPES[x.dtype],
                                        BLOCK=triton.next_power_of_2(n), num_warps=4)
    return out


def stack_step(x, weights, norm_w, k_caches, v_caches, cos_table, sin_table, rope_pos, write_idx, lo, d):
    """lean.stack_step's contract, five kernels per layer."""
    b, t, hidden = x.shape
    h = x.reshape(b * t, hidden).contiguous()
    for w, kc, vc in zip(weights, k_caches, v_caches, strict=True):
        qkv = linear(h, w.wqkv, norm_w=w.ln1, eps=d.eps)
        attn = attention(qkv, kc, vc, w.q_norm, w.k_norm, cos_table, sin_table, rope_pos, write_idx, lo, d)
        h = linear(attn, w.wo, residual=h)
        h = linear(linear(h, w.wgu, norm_w=w.ln2, eps=d.eps, silu=True), w.wd, residual=h)
    return rms_norm(h, norm_w, d.eps).view(b, t, hidden)
