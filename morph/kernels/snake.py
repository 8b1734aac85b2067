"""The codec's SnakeBeta activation as one Triton kernel: upstream's five full-size elementwise ops in one pass, in
their order, rounded to the dtype after each (upstream's to rounding, not bit for bit: tests/gpu). `snake_samples` also
moves samples between two convolutions' layouts and may add a bias first, each a pass saved (morph/codec/layers.py)."""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..errors import reason
from .common import TL_DTYPES, as_ptr

log = logging.getLogger(__name__)

BLOCK = 1024


@triton.jit
def _snake_beta(x, a, inv, DTYPE: tl.constexpr):
    """fp32 values x (each already in DTYPE) through upstream's five ops, each rounded to DTYPE."""
    s = libdevice.sin((x * a).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    m = (inv * (s * s).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    return (x + m).to(DTYPE)


@triton.jit
def _snake_kernel(x_addr, a_addr, inv_addr, o_addr, C, INNER, N, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
                  WIDE: tl.constexpr):
    """x [B, C, T] (upstream's layout); offsets are 64-bit only where needed (WIDE): 32-bit division is cheaper."""
    pid = tl.program_id(0).to(tl.int64) if WIDE else tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    channel = (offs // INNER) % C
    a = tl.load(as_ptr(a_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)
    inv = tl.load(as_ptr(inv_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(as_ptr(x_addr, DTYPE) + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(as_ptr(o_addr, DTYPE) + offs, _snake_beta(x, a, inv, DTYPE), mask=ok)


@triton.jit
def _at(row, sample, channel, ROW, SHIFT, EVERY: tl.constexpr, C):
    """Where sample `sample` of row `row` lies, as Samples lays it out."""
    s = sample + SHIFT
    return (row * EVERY + s % EVERY) * ROW + (s // EVERY) * C + channel


# The shapes are run-time and unspecialized, so one compile serves every layer's call shape and only the layout and
# bias are compiled apart: a new machine's first load waits for each compile.
@triton.jit(do_not_specialize=["T", "N", "X_SHIFT", "O_SHIFT"])
def _snake_samples_kernel(x_addr, a_addr, inv_addr, b_addr, o_addr, T, N, C, X_ROW, X_SHIFT, O_ROW, O_SHIFT,
                          X_EVERY: tl.constexpr, O_EVERY: tl.constexpr, BIAS: tl.constexpr, DTYPE: tl.constexpr,
                          BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """Element i of [rows, T, C] (channels last), read and written where the Samples put it."""
    pid = tl.program_id(0).to(tl.int64) if WIDE else tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    frame = offs // C
    channel = offs - frame * C
    row = frame // T
    sample = frame - row * T
    a = tl.load(as_ptr(a_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)
    inv = tl.load(as_ptr(inv_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(as_ptr(x_addr, DTYPE) + _at(row, sample, channel, X_ROW, X_SHIFT, X_EVERY, C), mask=ok, other=0.0)
    x = x.to(tl.float32)
    if BIAS:  # a convolution's bias, added as torch adds it to the convolution's rounded output
        x = (x + tl.load(as_ptr(b_addr, DTYPE) + channel, mask=ok, other=0.0).to(tl.float32)).to(DTYPE)
        x = x.to(tl.float32)
    y = _snake_beta(x, a, inv, DTYPE)
    tl.store(as_ptr(o_addr, DTYPE) + _at(row, sample, channel, O_ROW, O_SHIFT, O_EVERY, C), y, mask=ok)


def snake(x: torch.Tensor, module) -> torch.Tensor:
    """SnakeBeta `module` applied to x [B, C, T] (contiguous, the module's dtype)."""
    alpha = torch.exp(module.alpha)
    inv = 1.0 / (torch.exp(module.beta) + module.no_div_by_zero)
    out = torch.empty_like(x)
    n = x.numel()
    _snake_kernel[(triton.cdiv(n, BLOCK),)](x.data_ptr(), alpha.data_ptr(), inv.data_ptr(), out.data_ptr(),
                                            x.shape[1], x.shape[2], n, DTYPE=TL_DTYPES[x.dtype], BLOCK=BLOCK,
                                            WIDE=n >= 2**31 - BLOCK, num_warps=4)
    return out


def _rows_dense(t: torch.Tensor) -> bool:
    """Whether each row of t [rows, T, C] is dense, as a slice along time of a longer tensor is."""
    return t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]


class Samples(NamedTuple):
    """Where the samples of [rows, T, C] lie in `tensor`, seen as [rows * every, length, C] with dense rows: sample t
    of row r is at row r * every + s % every, position s // every, s = t + shift. every = d interleaves a row d ways,
    the input of a dilation-d convolution run as d plain ones (morph/codec/layers.py)."""

    tensor: torch.Tensor
    every: int = 1
    shift: int = 0

    def row(self) -> int:
        t = self.tensor
        assert _rows_dense(t), "snake_samples: each row must be dense"
        return t.stride(0)


def snake_samples(x: Samples, out: Samples, rows: int, samples: int, alpha: torch.Tensor, inv: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """SnakeBeta of rows x samples, channels last, from x into out, given exp(alpha) and 1 / (exp(beta) + 1e-9) per
    channel in x's dtype; a bias added first where given. Returns out's tensor."""
    c = x.tensor.shape[-1]
    n = rows * samples * c
    x_row, o_row = x.row(), out.row()
    span = max(n, rows * x.every * x_row, rows * out.every * o_row)
    _snake_samples_kernel[(triton.cdiv(n, BLOCK),)](
        x.tensor.data_ptr(), alpha.data_ptr(), inv.data_ptr(), (bias if bias is not None else alpha).data_ptr(),
        out.tensor.data_ptr(), samples, n, c, x_row, x.shift, o_row, out.shift, X_EVERY=x.every, O_EVERY=out.every,
        BIAS=bias is not None, DTYPE=TL_DTYPES[x.tensor.dtype], BLOCK=BLOCK, WIDE=span >= 2**31 - BLOCK, num_warps=4)
    return out.tensor


def snake_last(x: torch.Tensor, alpha: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """SnakeBeta of x [B, T, C] (channels last, each row dense) into a new tensor."""
    x = x if _rows_dense(x) else x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return snake_samples(Samples(x), Samples(out), x.shape[0], x.shape[1], alpha, inv)


_failed: list[str] = []


def forward(module, x: torch.Tensor) -> torch.Tensor:
    """What a patched SnakeBeta runs: the kernel where it applies, else upstream's (always, once the kernel fails)."""
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
