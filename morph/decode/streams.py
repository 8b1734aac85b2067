"""One random stream per row, so a sampled line's take depends on its seed and content only, not on its batch or when
it joined: its race's Exp(1) values (sampling.draw) are a counter-based hash of (row key, frame, draw slot, token) on
the device, which a CUDA graph replays. Slot 0 is the talker's draw (frame -1 the prefill's), 1..15 the groups'."""

from __future__ import annotations

import torch

SLOTS = 16  # draws per frame: the talker's and the predictor's 15 groups
_MASK = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors: products wrap, and only their low 32 bits are kept."""
    x = x & _MASK
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _MASK
    return x ^ (x >> 16)


class RowStreams:
    """Exp(1) values for every draw of one frame of every row, made once per frame and sliced per draw."""

    def __init__(self, vocab: int, device):
        self.vocab = vocab
        self.tokens = _mix(torch.arange(vocab, dtype=torch.long, device=device) * 0x9E3779B9 + 1)  # [V]
        self.slots = torch.arange(SLOTS, dtype=torch.long, device=device)

    def frame(self, keys: torch.Tensor, frame: torch.Tensor) -> "FrameNoise":
        """keys [B] (int64, 32-bit values) and each row's own frame index [B] (-1: the prefill's draw)."""
        counter = (frame.view(-1, 1) + 1) * SLOTS + self.slots  # [B, SLOTS], distinct per (frame, slot)
        base = _mix(_mix(keys.view(-1, 1) ^ _mix(counter)) + counter)  # [B, SLOTS]
        bits = _mix(base.unsqueeze(-1) ^ self.tokens)  # [B, SLOTS, V]
        uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits
        # the top value rounds to 1.0 in float32, an Exp(1) value of 0: a token of probability 0 would race with
        # 0 / 0 = NaN, which the fused argmax would turn into an index past the vocabulary (a device-side assert)
        uniform.clamp_(max=1.0 - 2.0 ** -24)
        return FrameNoise(-torch.log(uniform))


class FrameNoise:
    """morph/decode/sampling.py's Noise for one frame: the values of draw slot `slot` onward, shaped like probs."""

    def __init__(self, values: torch.Tensor):
        self.values = values  # [B, SLOTS, V]

    def __call__(self, probs: torch.Tensor, slot: int) -> torch.Tensor:
        n, v = (probs.shape[1] if probs.dim() == 3 else 1), probs.shape[-1]
        return self.values[:, slot:slot + n, :v].reshape(probs.shape)
