"""The fused attention of a decode step (morph/kernels/layers.py's second kernel of five): per-head
q/k RMSNorm, RoPE, the new tokens' K/V written into the cache, and attention over the cache, in
one kernel per (batch row, kv head), its cache split over several programs when there are few rows
(flash-decoding: a second, small kernel combines the splits). Kernels take addresses, as in
morph/kernels/layers.py.
"""

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
def _in_pool(page, s, h, KVH: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of logical slots s of kv head h that live in pages `page` of a pool [NP, KVH, PAGE, D]."""
    return (page * KVH + h) * (PAGE * D) + (s % PAGE) * D


@triton.jit
def _slot_offsets(s, ok, b, h, table_addr, L: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
                  PAGED: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of logical slots s [N] of (row b, kv head h): cache[b, h, s] in a dense cache
    [B, KVH, L, D]; with PAGED, pool[table[b, s // PAGE], h, s % PAGE] in a pool [NP, KVH, PAGE, D]
    (the table [B, L / PAGE] is read only where ok: other slots get the null page 0, never loaded)."""
    if PAGED:
        page = tl.load(as_ptr(table_addr, tl.int64) + b * (L // PAGE) + s // PAGE, mask=ok, other=0)
        off = _in_pool(page, s, h, KVH, D, PAGE)
    else:
        off = (b * KVH + h) * L * D + s * D
    return off


@triton.jit
def _tile_pages(s0, lo, hi, b, table_addr, L: tl.constexpr, PAGE: tl.constexpr, NPT: tl.constexpr,
                PAGED: tl.constexpr):
    """The page numbers [NPT] of the tile of NPT pages from slot s0 of row b (paged; a tile is whole pages): pages
    wholly outside slots lo .. hi-1, or past the table, get the null page 0 and are not read. Dense: a placeholder."""
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
    """One (batch row, kv head, split): the G = H / KVH query heads of that kv head attend over slots
    lo[b] .. their own slot, in the split's tiles (every SPLITS-th BLOCK_L slots from split * BLOCK_L), the T new
    tokens' K/V written into the cache first where they fall in those tiles. With one split the output is final;
    with more each writes its softmax's running max, sum and unnormalised output to `part` for _combine_kernel.
    Slots are logical: with PAGED, kc/vc are page pools and the table maps them (_slot_offsets)."""
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
    # The cache length is a compile-time constant and blocks outside lo .. hi are skipped,
    # rather than a loop over lo .. hi: loop bounds read from memory break Triton's CPU
    # interpreter, which the CPU tests use. Paged, a tile's page numbers are read one tile ahead
    # (each page's once), so that the keys' loads do not wait behind the table's.
    NPT: tl.constexpr = BLOCK_L // PAGE if PAGED else 1
    STRIDE: tl.constexpr = BLOCK_L * SPLITS
    pages = _tile_pages(split * BLOCK_L, lo, hi, b, table_addr, L, PAGE, NPT, PAGED)
    for s_base in range(0, L, STRIDE):
        s0 = s_base + split * BLOCK_L
        here = pages
        pages = _tile_pages(s0 + STRIDE, lo, hi, b, table_addr, L, PAGE, NPT, PAGED)
        if (s0 < hi) & (s0 + BLOCK_L > lo):
            s = s0 + tl.arange(0, BLOCK_L)
            # slots below lo are not loaded: paged, in a tile wider than a page their pages may be the null page, whose
            # contents are anything; and
            # a slot no row holds steps with whatever bound its last row left, and would write NaN there (0 / 0 below),
            # which a zero weight times NaN would carry into the next row to join that slot
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
    """One (batch row, kv head, query row r = g * T + t): its splits' partial softmaxes into its output row
    (flash-decoding's reduction). A split that saw no slot has max -inf and sum 0 and weighs nothing."""
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


# -- launcher -----------------------------------------------------------------------------
def _tiles(length: int) -> tuple[int, int]:
    """BLOCK_L and num_warps: 64-slot tiles and 4 warps over the talker's caches, dense or paged (a paged tile is
    whole pages: two of 32 slots), faster than 128-slot tiles and 8 warps for a batch and for a lone row, static or
    continuous (bench/results/h200-2026-11-26b/NOTES.md)."""
    return (16, 4) if length <= 16 else (64, 4)


# Fewer (batch rows x kv heads) than this split each row's cache (flash-decoding): one program a row and kv head
# would leave a lone row's attention on as many SMs as it has kv heads, a few of the GPU's, and split is faster at
# batch 16 too (bench/results/h200-2026-11-26b/NOTES.md).
TARGET_PROGRAMS = 256


def _splits(programs: int, tiles: int) -> int:
    """How many splits each (row, kv head) runs its cache's `tiles` tiles in: a power of two (the combine kernel
    loads them as one block), so that `programs` pairs make about TARGET_PROGRAMS programs, and no more than the
    tiles rounded up to a power of two."""
    want = max(1, TARGET_PROGRAMS // max(programs, 1))
    return min(triton.next_power_of_2(want), triton.next_power_of_2(tiles))


def attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_norm: torch.Tensor,
              k_norm: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, rope_pos: torch.Tensor,
              write_idx: torch.Tensor, lo: torch.Tensor, d, table: torch.Tensor | None = None) -> torch.Tensor:
    """qkv [B*T, (H + 2 KVH) D] -> attention output [B*T, H D]; writes the new K/V into the
    caches [B, KVH, L, D] at write_idx [T]. rope_pos [B, T] indexes the [*, D] cos/sin tables;
    row b attends to slots lo[b] .. (its token's slot).

    Paged (vLLM's layout): with `table` [B, L / PAGE] (int64, contiguous, the same for every
    layer), k_cache and v_cache are pools [NP, KVH, PAGE, D] of pages (PAGE a power of two;
    page 0 the null page that unallocated entries point to), and slot s of row b lives at
    pool[table[b, s // PAGE], :, s % PAGE]. Pages wholly outside lo[b] .. the last new slot are
    never read, so they may be the null page."""
    hd = k_cache.shape[3]
    if table is None:
        b, page, length = k_cache.shape[0], 1, k_cache.shape[2]
    else:
        assert table.dtype == torch.int64 and table.is_contiguous()
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        b, page = table.shape[0], k_cache.shape[2]
        length = table.shape[1] * page
    t = write_idx.shape[0]
    block_l, warps = _tiles(length)
    assert block_l % page == 0, "a paged tile is whole pages"  # _tile_pages
    out = torch.empty(qkv.shape[0], d.q_size, device=qkv.device, dtype=qkv.dtype)
    rows = max(16, triton.next_power_of_2(d.heads // d.kv_heads * t))
    splits = _splits(b * d.kv_heads, triton.cdiv(length, block_l))
    group = d.heads // d.kv_heads * t  # the query rows of a kv head
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
