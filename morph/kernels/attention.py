"""The fused attention of a decode step: per-head q/k RMSNorm, RoPE, the new K/V written, attention over the cache; one
program per (batch row, kv head), split over several when rows are few (flash-decoding: a second kernel combines)."""

from __future__ import annotations

import torch

import triton
import triton.language as tl

from .common import TL_DTYPES, _weighted, as_ptr


@triton.jit
def _dot(a, b, acc, DTYPE: tl.constexpr):
    """acc + a @ b^T; fp32 inputs multiply in full fp32 (Triton would use TF32)."""
    if DTYPE == tl.float32:
        return tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(b), acc)


@triton.jit
def _norm_rope(x, x_rot, w, w_rot, sign, cos, sin, eps, D: tl.constexpr, DTYPE: tl.constexpr):
    """Per-head RMSNorm, then RoPE, of rows x [R, D]; x_rot/w_rot are x and w at the rotate_half positions, sign is -1
    on the first half (HF: q * cos + rotate_half(q) * sin)."""
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
    xn = _weighted(xf * rstd, w[None, :], DTYPE)
    xr = _weighted(x_rot.to(tl.float32) * rstd, w_rot[None, :], DTYPE)
    a = (xn.to(tl.float32) * cos.to(tl.float32)).to(DTYPE)
    b = ((sign[None, :] * xr.to(tl.float32)) * sin.to(tl.float32)).to(DTYPE)
    return (a.to(tl.float32) + b.to(tl.float32)).to(DTYPE)


@triton.jit
def _in_pool(page, s, h, KVH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of logical slots s of kv head h that live in pages `page` of a pool [NP, KVH, PAGE, D]."""
    return (page * KVH + h) * (PAGE * D) + (s % PAGE) * D


@triton.jit
def _slot_offsets(s, ok, b, h, table_addr, L: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
                  PAGED: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of logical slots s [N] of (row b, kv head h) in a dense cache [B, KVH, L, D], or with PAGED in
    a pool [NP, KVH, PAGE, D] through the table [B, L / PAGE], read only where ok (elsewhere the null page 0)."""
    if PAGED:
        page = tl.load(as_ptr(table_addr, tl.int64) + b * (L // PAGE) + s // PAGE, mask=ok, other=0)
        off = _in_pool(page, s, h, KVH, D, PAGE)
    else:
        off = (b * KVH + h) * L * D + s * D
    return off


@triton.jit
def _tile_pages(s0, lo, hi, b, table_addr, L: tl.constexpr, PAGE: tl.constexpr, NPT: tl.constexpr,
                PAGED: tl.constexpr):
    """Page numbers [NPT] of the tile from slot s0 of row b; pages outside lo .. hi-1 or the table: the null page 0."""
    if PAGED:
        p = s0 // PAGE + tl.arange(0, NPT)
        ok = (p < L // PAGE) & (p * PAGE < hi) & ((p + 1) * PAGE > lo)
        return tl.load(as_ptr(table_addr, tl.int64) + b * (L // PAGE) + p, mask=ok, other=0)
    return tl.zeros([NPT], dtype=tl.int64)


@triton.jit
def _attention_kernel(qkv_addr, o_addr, kc_addr, vc_addr, qn_addr, kn_addr, cos_addr, sin_addr, pos_addr, slot_addr,
                      lo_addr, table_addr, part_addr, pos_sb, pos_st, eps, scale, L: tl.constexpr,
                      H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, T: tl.constexpr, TP: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK_L: tl.constexpr, DTYPE: tl.constexpr, PAGED: tl.constexpr,
                      PAGE: tl.constexpr, SPLITS: tl.constexpr):
    """One (batch row, kv head, split): the kv head's H / KVH query heads attend over slots lo[b] .. their own in the
    split's tiles (every SPLITS-th BLOCK_L slots), the T new tokens' K/V written first. With more than one split, each
    writes its running max, sum and unnormalised output to `part` for _combine_kernel."""
    b, h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = H // KVH
    width: tl.constexpr = (H + 2 * KVH) * D
    qkv, kc, vc = as_ptr(qkv_addr, DTYPE), as_ptr(kc_addr, DTYPE), as_ptr(vc_addr, DTYPE)
    cos_t, sin_t = as_ptr(cos_addr, DTYPE), as_ptr(sin_addr, DTYPE)
    pos_p, slot_p = as_ptr(pos_addr, tl.int64), as_ptr(slot_addr, tl.int64)
    d = tl.arange(0, D)
    d_rot = (d + D // 2) % D
    sign = tl.where(d < D // 2, -1.0, 1.0)

    # the new keys (normed, rotated) and values, written at their slots, by the split that reads them
    t = tl.arange(0, TP)
    slot = tl.load(slot_p + t, mask=t < T, other=0)
    t_ok = (t < T) & ((slot // BLOCK_L) % SPLITS == split)
    row = (b * T + t)[:, None] * width
    kn, kn_rot = tl.load(as_ptr(kn_addr, DTYPE) + d), tl.load(as_ptr(kn_addr, DTYPE) + d_rot)
    pos = tl.load(pos_p + b * pos_sb + t * pos_st, mask=t_ok, other=0)[:, None] * D
    k_col = (H + h) * D
    k = tl.load(qkv + row + k_col + d[None, :], mask=t_ok[:, None], other=0.0)
    k_rot = tl.load(qkv + row + k_col + d_rot[None, :], mask=t_ok[:, None], other=0.0)
    k = _norm_rope(k, k_rot, kn, kn_rot, sign, tl.load(cos_t + pos + d[None, :]), tl.load(sin_t + pos + d[None, :]),
                   eps, D, DTYPE)
    v = tl.load(qkv + row + (H + KVH + h) * D + d[None, :], mask=t_ok[:, None], other=0.0)
    w_off = _slot_offsets(slot, t_ok, b, h, table_addr, L, KVH, D, PAGED, PAGE)[:, None] + d[None, :]
    tl.store(kc + w_off, k, mask=t_ok[:, None])
    tl.store(vc + w_off, v, mask=t_ok[:, None])
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
    # A loop over the whole constant length, skipping tiles outside lo .. hi: bounds read from memory break Triton's
    # CPU interpreter, which the tests use. Paged, the page numbers are read a tile ahead so keys do not wait on them.
    NPT: tl.constexpr = BLOCK_L // PAGE if PAGED else 1
    STRIDE: tl.constexpr = BLOCK_L * SPLITS
    pages = _tile_pages(split * BLOCK_L, lo, hi, b, table_addr, L, PAGE, NPT, PAGED)
    for s_base in range(0, L, STRIDE):
        s0 = s_base + split * BLOCK_L
        here = pages
        pages = _tile_pages(s0 + STRIDE, lo, hi, b, table_addr, L, PAGE, NPT, PAGED)
        if (s0 < hi) & (s0 + BLOCK_L > lo):
            s = s0 + tl.arange(0, BLOCK_L)
            # slots below lo are not loaded: their page may be the null page (anything), and a free slot's stale
            # contents may be NaN, which a zero weight would carry into the next row to join that slot
            kv_ok = (s < hi) & (s >= lo)
            if PAGED:
                page = tl.reshape(tl.broadcast_to(here[:, None], (NPT, PAGE)), (BLOCK_L,))
                kv_off = _in_pool(page, s, h, KVH, D, PAGE)
            else:
                kv_off = (b * KVH + h) * L * D + s * D
            kv_off = kv_off[:, None] + d[None, :]
            kb = tl.load(kc + kv_off, mask=kv_ok[:, None], other=0.0)
            scores = _dot(q, kb, tl.zeros([ROWS, BLOCK_L], dtype=tl.float32), DTYPE) * scale
            valid = (s[None, :] >= lo) & (s[None, :] <= last[:, None])
            scores = tl.where(valid, scores, float("-inf"))
            # a split's first tile visited may hold no slot a query row sees (its own slot is below it): the
            # maximum stays -inf there, and alpha and p must be 0, not NaN
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(scores - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vb = tl.load(vc + kv_off, mask=kv_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + _dot(p.to(DTYPE), tl.trans(vb), tl.zeros([ROWS, D], dtype=tl.float32),
                                              DTYPE)
            m_i = m_new
    o_off = ((b * T + tq) * (H * D) + (h * G + r // T) * D)[:, None]
    if SPLITS == 1:
        # a row that sees no slot (a free slot whose bound its last row left past the position) gets 0, not 0 / 0
        out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
        tl.store(as_ptr(o_addr, DTYPE) + o_off + d[None, :], out.to(DTYPE), mask=r_ok[:, None])
    else:
        # part [B, KVH, G * T, SPLITS, D + 2]: each real query row's max, sum and output
        part = as_ptr(part_addr, tl.float32) + (((b * KVH + h) * G * T + r) * SPLITS + split) * (D + 2)
        tl.store(part, m_i, mask=r_ok)
        tl.store(part + 1, l_i, mask=r_ok)
        tl.store(part[:, None] + 2 + d[None, :], acc, mask=r_ok[:, None])


@triton.jit
def _combine_kernel(part_addr, o_addr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, T: tl.constexpr,
                    SPLITS: tl.constexpr, DTYPE: tl.constexpr):
    """One (batch row, kv head, query row r = g * T + t): its splits' partial softmaxes into its output row. A split
    that saw no slot has max -inf and sum 0 and weighs nothing."""
    b, h, r = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = H // KVH
    d, sp = tl.arange(0, D), tl.arange(0, SPLITS)
    part = as_ptr(part_addr, tl.float32) + (((b * KVH + h) * G * T + r) * SPLITS + sp) * (D + 2)
    m = tl.load(part)
    top = tl.max(m, axis=0)
    w = tl.exp(m - tl.where(top == float("-inf"), 0.0, top))  # no split saw a slot: every weight 0, the output 0
    total = tl.sum(w * tl.load(part + 1), axis=0)
    out = tl.sum(w[:, None] * tl.load(part[:, None] + 2 + d[None, :]), axis=0) / tl.where(total > 0, total, 1.0)
    o_off = (b * T + r % T) * (H * D) + (h * G + r // T) * D
    tl.store(as_ptr(o_addr, DTYPE) + o_off + d, out.to(DTYPE))


def _tiles(length: int) -> tuple[int, int]:
    """BLOCK_L and num_warps (bench/results/h200-2026-11-26b/NOTES.md); a paged tile is whole pages."""
    return (16, 4) if length <= 16 else (64, 4)


# Fewer (batch rows x kv heads) than this split each row's cache, else a lone row runs on only as many SMs as kv heads.
TARGET_PROGRAMS = 256


def _splits(programs: int, tiles: int) -> int:
    """Splits per (row, kv head) for about TARGET_PROGRAMS programs: a power of two, which the combine kernel loads."""
    want = max(1, TARGET_PROGRAMS // max(programs, 1))
    return min(triton.next_power_of_2(want), triton.next_power_of_2(tiles))


def attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_norm: torch.Tensor,
              k_norm: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, rope_pos: torch.Tensor,
              write_idx: torch.Tensor, lo: torch.Tensor, d, table: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention of lean.stack_step: qkv [B*T, (H + 2 KVH) D] -> [B*T, H D], the new K/V written into the
    caches [B, KVH, L, D], or with `table` [B, L / PAGE] (int64, contiguous) into pools in kv_store.py's layout."""
    hd = k_cache.shape[3]
    if table is None:
        b, page, length = k_cache.shape[0], 1, k_cache.shape[2]
    else:
        assert table.dtype == torch.int64 and table.is_contiguous()
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        b, page, length = table.shape[0], k_cache.shape[2], table.shape[1] * k_cache.shape[2]
    t = write_idx.shape[0]
    block_l, warps = _tiles(length)
    assert block_l % page == 0, "a paged tile is whole pages"  # _tile_pages
    out = torch.empty(qkv.shape[0], d.q_size, device=qkv.device, dtype=qkv.dtype)
    group = d.heads // d.kv_heads * t  # the query rows of a kv head
    rows = max(16, triton.next_power_of_2(group))
    splits = _splits(b * d.kv_heads, triton.cdiv(length, block_l))
    part = torch.empty(b, d.kv_heads, group, splits, hd + 2, device=qkv.device, dtype=torch.float32) \
        if splits > 1 else out
    dtype = TL_DTYPES[qkv.dtype]
    _attention_kernel[(b, d.kv_heads, splits)](
        qkv.data_ptr(), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), q_norm.data_ptr(), k_norm.data_ptr(),
        cos_table.data_ptr(), sin_table.data_ptr(), rope_pos.data_ptr(), write_idx.data_ptr(), lo.data_ptr(),
        table.data_ptr() if table is not None else 0, part.data_ptr(), rope_pos.stride(0), rope_pos.stride(1), d.eps,
        d.scale, L=length, H=d.heads, KVH=d.kv_heads, D=hd, T=t, TP=triton.next_power_of_2(t), ROWS=rows,
        BLOCK_L=block_l, DTYPE=dtype, PAGED=table is not None, PAGE=page, SPLITS=splits, num_warps=warps)
    if splits > 1:
        _combine_kernel[(b, d.kv_heads, group)](part.data_ptr(), out.data_ptr(), H=d.heads, KVH=d.kv_heads, D=hd,
                                                T=t, SPLITS=splits, DTYPE=dtype, num_warps=4)
    return out
