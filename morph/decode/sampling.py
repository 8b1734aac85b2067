"""Token sampling with HF `generate` semantics (its order, and the number and shape of its draws), so seeded runs match
upstream bit for bit. `draw` is ATen's one-sample multinomial written out, the race argmax(p / q) over q ~ Exp(1): the
same picks without a host sync, so capturable. q comes from `noise`: torch's generator or a row's own (streams.py)."""

from __future__ import annotations

from typing import Callable

import torch

from ..kernels.kth import kth_largest
from ..settings import Sampling


# (probs [B, V] or [B, n, V], index of the row's first draw this frame) -> Exp(1) values shaped like probs
Noise = Callable[[torch.Tensor, int], torch.Tensor]


def torch_noise(probs: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """Upstream's stream: torch's generator, one `exponential_` over a tensor shaped like probs (slot unused)."""
    return torch.empty_like(probs).exponential_(1)


def warp(scores: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Apply temperature, top-k and top-p to float32 logits [..., V], as HF does."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k and s.top_k > 0:
        k = min(int(s.top_k), scores.size(-1))
        kth = kth_largest(scores, k)  # == torch.topk(scores, k)[0][..., -1:], faster on CUDA
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if s.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - s.top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(-1, sorted_idx, remove), -float("inf"))
    return scores


def pick(scores: torch.Tensor, s: Sampling, noise: Noise = torch_noise, slot: int = 0) -> torch.Tensor:
    """One token a row of scores [B, (n,) V], greedy or warped, in float32 -> int64 [B, (n)]; all rows drawn at once,
    so with torch_noise the RNG moves exactly as in one HF generate step."""
    if not s.do_sample:
        return scores.float().argmax(dim=-1)
    probs = warp(scores.float(), s).softmax(dim=-1)
    return draw(probs, noise(probs, slot))


def fused_pick(scores: torch.Tensor, s: Sampling, noise: Noise = torch_noise, slot: int = 0) -> torch.Tensor:
    """`pick` with the fused kernels of morph/kernels/sampling.py for a sampled draw without top-p."""
    if not s.do_sample or s.top_p < 1.0:
        return pick(scores, s, noise, slot)
    from ..kernels.sampling import sample_warped  # Triton: imported only when the fused mode runs

    return sample_warped(scores, s, noise, slot)


def draw(probs: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """`torch.multinomial(probs, 1).squeeze(-1)` without host syncs, given Exp(1) values shaped like probs."""
    return probs.div(exponentials).argmax(dim=-1)


class TalkerRules:
    """The talker's logits processing before the warpers, in upstream's order, as device tensors (graph-safe)."""

    def __init__(self, vocab_size: int, eos_token_id: int, suppress_tokens, repetition_penalty: float,
                 device, do_sample: bool, temperature: float, top_k: int, top_p: float):
        self.eos = int(eos_token_id)
        self.repetition_penalty = float(repetition_penalty)
        self.sampling = Sampling(bool(do_sample), float(temperature), int(top_k or 0), float(top_p))
        self.eos_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.eos_mask[self.eos] = True
        self.suppress_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        suppress = [int(t) for t in (suppress_tokens or [])]
        if suppress:
            self.suppress_mask[torch.tensor(suppress, device=device)] = True
        self.key = (self.eos, tuple(suppress), self.repetition_penalty, self.sampling)

    def next_token(self, logits, seen, n_generated, min_new_tokens, picker=None,
                   noise: Noise = torch_noise) -> torch.Tensor:
        """The next code-0 token [B]; `picker` is talker_pick or its fused twin."""
        return (picker or talker_pick)(logits, seen, n_generated, min_new_tokens, self.eos_mask, self.suppress_mask,
                                       self.repetition_penalty, self.sampling, noise=noise)


def talker_scores(logits, seen, n_generated, min_new_tokens, eos_mask, suppress_mask,
                  repetition_penalty: float) -> torch.Tensor:
    scores = logits.float()
    if repetition_penalty != 1.0:
        p = repetition_penalty
        scores = torch.where(seen, torch.where(scores < 0, scores * p, scores / p), scores)
    # n_generated is one count [1] or a row's own count [B] (rows that joined a running batch later)
    scores = torch.where(eos_mask & (n_generated < min_new_tokens).unsqueeze(-1), -float("inf"), scores)
    return torch.where(suppress_mask, -float("inf"), scores)


def talker_pick(logits, seen, n_generated, min_new_tokens, eos_mask, suppress_mask, repetition_penalty: float,
                sampling: Sampling, pick_fn=pick, noise: Noise = torch_noise) -> torch.Tensor:
    """Upstream's talker logits processing, then the pick (`pick_fn`); the talker's draw is its frame's slot 0."""
    return pick_fn(talker_scores(logits, seen, n_generated, min_new_tokens, eos_mask, suppress_mask,
                                 repetition_penalty), sampling, noise, 0)
