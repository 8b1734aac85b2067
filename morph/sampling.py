"""Token sampling with HF `generate` semantics, so seeded runs match upstream qwen-tts.

HF applies its warpers in a fixed order (temperature, top-k, top-p), then softmax and
one `torch.multinomial` per step. Matching that order, and the number and shape of the
multinomial draws, is what keeps seeded sampling bit-identical to upstream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How the code predictor picks each codec token (upstream's `subtalker_*` settings)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0

    def validate(self, who: str = "Sampling") -> "Sampling":
        if not (self.temperature > 0):
            raise ValueError(f"{who}: temperature must be > 0, got {self.temperature}; use 1.0 for none")
        if int(self.top_k) < 0:
            raise ValueError(f"{who}: top_k must be >= 0, got {self.top_k}; use 0 to switch top-k off")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"{who}: top_p must be in (0, 1], got {self.top_p}; use 1.0 to switch top-p off")
        return self


def warp(scores: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Apply temperature, top-k and top-p to float32 logits [..., V], as HF does."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k and s.top_k > 0:
        k = min(int(s.top_k), scores.size(-1))
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if s.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - s.top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(-1, sorted_idx, remove), -float("inf"))
    return scores


def sample(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Pick one token per row of logits [..., V]; returns int64 [...].

    All rows are drawn in one multinomial call, so for [B, V] this consumes the RNG
    exactly as one HF generate step does.
    """
    scores = logits.float()
    if not s.do_sample:
        return scores.argmax(dim=-1)
    probs = warp(scores, s).softmax(dim=-1)
    flat = probs.reshape(-1, probs.size(-1))
    return torch.multinomial(flat, num_samples=1).reshape(probs.shape[:-1])
