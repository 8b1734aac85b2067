"""The reference loop, eager mode's `talker.generate`: after upstream's own prefill, the frame step every mode runs on
the checkpoint's own HF layers, returning what upstream's generate reads, so EOS trimming stays upstream's."""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Callable

import torch

from ..decode.sampling import TalkerRules
from ..decode.talker_loop import TalkerLoop
from ..decode.talker_state import TalkerState


class HFTalker:
    """The talker's layers as upstream's HF generate calls them for one token (the reference loop's talker step)."""

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


def generate(loop: TalkerLoop, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor,
             trailing_text_hidden: torch.Tensor, tts_pad_embed: torch.Tensor, *, seq_groups: int, max_new_tokens: int,
             min_new_tokens: int, on_step: Callable[[], None] | None, row_stops: list[int] | None,
             **options) -> SimpleNamespace:
    """Upstream's talker.generate for one batch on `loop`'s talker's HF layers, with the keywords upstream's generate
    passes it (the sampling ones as `options`). row_stops[i]: the frame at which row i ends (EOS forced)."""
    device, dtype = inputs_embeds.device, inputs_embeds.dtype
    batch, prompt_len = inputs_embeds.shape[:2]
    with torch.inference_mode():
        cp_sampling, rules = loop.rules(device, options)
        st = loop.state(batch, prompt_len + max_new_tokens, device, dtype, lean_kv=False)
        st.start.zero_()
        st.stop.copy_(torch.as_tensor(row_stops or [max_new_tokens] * batch, device=device))
        cache = _start(loop.talker, st, rules, inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed,
                       min_new_tokens)
        talker_layers = HFTalker(loop.talker, cache, attention_mask, prompt_len)

        def step():
            loop.frame_step(st, seq_groups, cp_sampling, rules, talker_layers,
                            lambda: loop.predictor.hf_layers(batch, device, dtype))

        frames_run = decode(st, step, max_new_tokens - 1, on_step, loop.sync_lag)
        tokens = st.tokens[:, :frames_run + 1].cpu()
    frames = _frames_kept(tokens, rules.eos, frames_run)
    codes, hidden = st.frames[:, :frames].clone(), st.hidden[:, :frames + 1].clone()
    loop.last_run = dict(mode="eager", seq_groups=seq_groups, frames_run=frames_run, frames=frames,
                         capacity=st.capacity)
    steps = [((hidden[:, 0:1],), None)] + [((hidden[:, j + 1:j + 2],), codes[:, j]) for j in range(frames)]
    return SimpleNamespace(hidden_states=steps, sequences=tokens[:, :frames + 1].to(device))


def prefill(talker, inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed):
    """Upstream's own talker forward over a (left-padded) prompt batch, with a fresh DynamicCache."""
    from transformers.cache_utils import DynamicCache

    prompt_len = inputs_embeds.shape[1]
    return talker(inputs_embeds=inputs_embeds, attention_mask=attention_mask, past_key_values=DynamicCache(),
                  use_cache=True, cache_position=torch.arange(prompt_len, device=inputs_embeds.device),
                  trailing_text_hidden=trailing_text_hidden, tts_pad_embed=tts_pad_embed, return_dict=True)


def _start(talker, st: TalkerState, rules: TalkerRules, inputs_embeds, attention_mask, trailing_text_hidden,
           tts_pad_embed, min_new_tokens: int):
    """Upstream's own prefill, then the state for frame 0; returns the prefill's DynamicCache."""
    prompt_len = inputs_embeds.shape[1]
    out = prefill(talker, inputs_embeds, attention_mask, trailing_text_hidden, tts_pad_embed)
    st.min_new.fill_(int(min_new_tokens))
    st.seen.zero_()
    token = rules.next_token(out.logits[:, -1], st.seen, torch.zeros_like(st.min_new), st.min_new)
    pads = prompt_len - attention_mask.sum(-1).to(torch.long)
    st.code0.copy_(token)
    st.past_hidden.copy_(out.past_hidden)
    st.step.zero_()
    st.cache_pos.fill_(prompt_len)
    st.pads.copy_(pads)
    st.rope_pos.copy_(prompt_len - pads)
    st.seen.scatter_(1, token.unsqueeze(1), True)
    st.unfinished.copy_(token != rules.eos)
    st.any_left.copy_(st.unfinished.any())
    st.tokens[:, 0] = token
    st.hidden[:, 0:1] = out.past_hidden
    st.put_text(slice(None), trailing_text_hidden, tts_pad_embed)
    return out.past_key_values


def decode(st: TalkerState, run: Callable[[], object], max_frames: int, on_step: Callable[[], None] | None,
           sync_lag: int) -> int:
    """Run up to max_frames steps, until every row has emitted EOS, read `sync_lag` frames behind the GPU so its queue
    never drains; returns the steps run."""
    cuda, ring = st.device.type == "cuda", sync_lag + 2
    flags = torch.ones(ring, dtype=torch.bool, pin_memory=cuda)
    pending: collections.deque = collections.deque()
    frames = 0
    if not bool(st.any_left):
        return 0
    for j in range(max_frames):
        if on_step is not None:
            on_step()
        run()
        frames += 1
        if not cuda:
            if not bool(st.any_left):
                break
            continue
        flags[j % ring].copy_(st.any_left, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        pending.append((event, j % ring))
        if len(pending) > sync_lag:
            event, i = pending.popleft()
            event.synchronize()
            if not bool(flags[i]):
                break
    return frames


def _frames_kept(tokens: torch.Tensor, eos: int, frames_run: int) -> int:
    """Frames upstream would have returned: HF stops once every row has sampled EOS."""
    is_eos = tokens == eos  # [B, frames_run + 1]
    if not bool(is_eos.any(dim=1).all()):
        return frames_run
    return min(int(is_eos.int().argmax(dim=1).max()), frames_run)
