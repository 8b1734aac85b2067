"""What the kernels share: torch dtypes as Triton's, addresses as typed pointers (kth.py says why), RMSNorm's end."""

from __future__ import annotations

import torch

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
