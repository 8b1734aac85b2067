"""The codec's SnakeBeta activation as one Triton kernel (CUDA tensors, Triton installed).

Upstream's SnakeBeta (the 12 Hz codec's decoder) is five full-size elementwise ops,
x * alpha, sin, square, times 1 / beta, plus x: five reads and writes of the decoder's
largest activations. On an H100 they were a third of the codec's GPU time (decoding 32
lines of 5 s: 153 ms of kernels, 107 ms with this one; bench/results/h100-2026-11-22c).

The kernel runs the same five operations in the same order and rounds to the tensor's
dtype after each one, as torch does for a bf16 op (computed in fp32, then rounded), with
libdevice's sine. It matches upstream's to rounding, not bit for bit: on an H100 most
values are equal and the rest are no further from the exact function than upstream's
(tests/gpu), where a sine or a fused multiply-add rounds differently from torch's kernels.
Only audio on CUDA goes through it; the codes, and everything on the CPU, are untouched.
exp(alpha) and 1 / (exp(beta) + 1e-9) are per channel and computed by torch as upstream
computes them. Like morph/kernels/layers.py the kernel takes addresses.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..errors import reason
from .common import TL_DTYPES, as_ptr

log = logging.getLogger(__name__)

BLOCK = 1024


@triton.jit
def _snake_kernel(x_addr, a_addr, inv_addr, o_addr, C, INNER, N, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
                  WIDE: tl.constexpr):
    """x's element i belongs to channel (i // INNER) % C: INNER is T for [B, C, T] (upstream's layout), 1 for
    [..., C] (channels last, the lean codec's, morph/codec/layers.py). Offsets are 64-bit only where they must be
    (WIDE): the division is much cheaper in 32 bits."""
    pid = tl.program_id(0).to(tl.int64) if WIDE else tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    channel = (offs // INNER) % C
    a = tl.load(as_ptr(a_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)
    inv = tl.load(as_ptr(inv_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(as_ptr(x_addr, DTYPE) + offs, mask=ok, other=0.0).to(tl.float32)
    s = libdevice.sin((x * a).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    m = (inv * (s * s).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    tl.store(as_ptr(o_addr, DTYPE) + offs, (x + m).to(DTYPE), mask=ok)


def _launch(x: torch.Tensor, alpha: torch.Tensor, inv: torch.Tensor, channels: int, inner: int) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _snake_kernel[(triton.cdiv(n, BLOCK),)](x.data_ptr(), alpha.data_ptr(), inv.data_ptr(), out.data_ptr(), channels,
                                            inner, n, DTYPE=TL_DTYPES[x.dtype], BLOCK=BLOCK, WIDE=n >= 2**31 - BLOCK,
                                            num_warps=4)
    return out


def snake(x: torch.Tensor, module) -> torch.Tensor:
    """SnakeBeta `module` applied to x [B, C, T] (contiguous, the module's dtype)."""
    alpha = torch.exp(module.alpha)
    inv = 1.0 / (torch.exp(module.beta) + module.no_div_by_zero)
    return _launch(x, alpha, inv, x.shape[1], x.shape[2])


def snake_last(x: torch.Tensor, alpha: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """SnakeBeta of x [..., C] (channels last) given exp(alpha) and 1 / (exp(beta) + 1e-9) per channel, all in x's
    dtype. The kernel reads x as one dense block: a slice (a trimmed transposed convolution's output) is copied."""
    return _launch(x.contiguous(), alpha, inv, x.shape[-1], 1)


_failed: list[str] = []


def forward(module, x: torch.Tensor) -> torch.Tensor:
    """What a patched SnakeBeta runs: the kernel where it applies, upstream's forward elsewhere. If the
    kernel fails (a Triton that cannot compile here), the log says so once and upstream's runs from then on."""
    fits = (x.is_cuda and x.dim() == 3 and x.is_contiguous() and x.dtype in TL_DTYPES
            and module.alpha.dtype == x.dtype and module.beta.dtype == x.dtype)
    if fits and not _failed:
        try:
            return snake(x, module)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:
            _failed.append(repr(e))
            log.warning("morph: the fused codec activation failed (%s); the codec runs upstream's from now on",
                        reason(e))
    return type(module).forward(module, x)
