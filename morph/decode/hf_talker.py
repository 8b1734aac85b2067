"""The talker's own HF layers for one token, called as upstream's HF generate calls them: mode "eager"'s step."""

from __future__ import annotations

import torch

from .talker_state import TalkerState


class HFTalker:
    """The talker's layers as upstream's HF generate calls them for one token (mode "eager")."""

    def __init__(self, talker, cache, attention_mask: torch.Tensor, prompt_len: int):
        self.talker, self.cache, self.mask, self.position = talker, cache, attention_mask, prompt_len

    def __call__(self, x: torch.Tensor, st: TalkerState) -> torch.Tensor:
        batch, device = x.shape[0], x.device
        self.mask = torch.cat([self.mask, self.mask.new_ones((batch, 1))], dim=-1)
        cache_position = torch.tensor([self.position], device=device)
        # Qwen3TTSTalkerForConditionalGeneration.forward's decode positions: the slot plus the prefill's rope deltas
        delta = cache_position[0] + self.talker.rope_deltas
        position_ids = torch.arange(1, device=device).view(1, -1).expand(batch, -1).add(delta)
        out = self.talker.model(inputs_embeds=x, attention_mask=self.mask,
                                position_ids=position_ids.unsqueeze(0).expand(3, -1, -1),
                                past_key_values=self.cache, use_cache=True, cache_position=cache_position)
        self.position += 1
        return out.last_hidden_state
