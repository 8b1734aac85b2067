"""The k-th largest value per row (HF's top-k threshold) without torch.topk's slow single-block select on CUDA: one
launch bisects every row's order-preserving bit patterns, bit for bit topk's `values[..., k-1]` (the CPU and setups
without Triton use topk). Kernels take addresses, not tensors: under cudaMallocAsync, memory allocated during a CUDA
graph capture has no physical backing yet, so Triton's launcher refuses tensors on it; integers are read at replay."""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    @triton.jit
    def kth_largest_in_row(x, valid, k):
        """The k-th largest of the valid entries of the float32 row x, by bisection over keys."""
        bits = x.to(tl.int32, bitcast=True)
        # order-preserving map float -> unsigned: negatives flip all bits, positives flip the sign bit
        key = tl.where(bits < 0, ~bits, bits ^ (-2147483648)).to(tl.uint32, bitcast=True)
        t = tl.zeros((), dtype=tl.uint32)
        for i in tl.static_range(32):
            cand = t | (tl.full((), 1, tl.uint32) << (31 - i))
            count = tl.sum(((key >= cand) & valid).to(tl.int32), axis=0)
            t = tl.where(count >= k, cand, t)
        sbits = t.to(tl.int32, bitcast=True)
        back = tl.where(sbits < 0, sbits ^ (-2147483648), ~sbits)
        return back.to(tl.float32, bitcast=True)

    @triton.jit
    def _kth_largest_kernel(x_addr, out_addr, n_cols, stride_row, k, BLOCK: tl.constexpr):
        x_ptr = x_addr.to(tl.pointer_type(tl.float32))
        out_ptr = out_addr.to(tl.pointer_type(tl.float32))
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_row + cols, mask=cols < n_cols, other=float("-inf"))
        tl.store(out_ptr + row, kth_largest_in_row(x, cols < n_cols, k))

    HAVE_TRITON = True
except Exception:  # no Triton: torch.topk everywhere
    HAVE_TRITON = False

MAX_TRITON_COLS = 8192


def _kth_rows(flat: torch.Tensor, k: int) -> torch.Tensor:
    out = torch.empty(flat.shape[0], device=flat.device, dtype=torch.float32)
    block = triton.next_power_of_2(flat.shape[1])
    with torch.cuda.device(flat.device):  # Triton launches on the current device
        _kth_largest_kernel[(flat.shape[0],)](flat.data_ptr(), out.data_ptr(), flat.shape[1], flat.stride(0), k,
                                              BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return out


def kth_largest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """float32 scores [..., V] -> the k-th largest of each row, shaped [..., 1]."""
    v = scores.shape[-1]
    if not (HAVE_TRITON and scores.is_cuda and scores.dtype == torch.float32 and v <= MAX_TRITON_COLS):
        return torch.topk(scores, k)[0][..., -1:]
    flat = scores.reshape(-1, v)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    return _kth_rows(flat, int(k)).reshape(*scores.shape[:-1], 1)
