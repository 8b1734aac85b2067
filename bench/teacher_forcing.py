"""Teacher forcing for bench/numerics.py: record the codes upstream qwen-tts generates, then run a
decode stack fed exactly those codes and keep every logit it produces.

- `record`: upstream's talker inputs (prompt embeddings, trailing text) and the 16 codes of
  every frame, EOS held back so that a recording has a fixed length.
- `hf_stack`: qwen-tts's HF layers (prefill, DynamicCache decode) as its generate calls them.
- `lean_stack`: morph's lean layers on static KV buffers, op by op ("lean") or replayed from
  CUDA graphs ("graphs", "fused").
Both return `Logits`: the talker's, the 15 sequential groups', and the crossbar's at each k.
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from unittest import mock

import torch
import torch.nn.functional as F

from bench.workload import eos_held_back
from morph import graphs
from morph.decode import lean, runner
from morph.decode.fused_stack import FusedStack
from morph.api import MorphTTS
from morph.settings import GenerationSettings

# -- recording the forced codes ------------------------------------------------------------
@dataclass
class Recording:
    """What upstream's talker.generate was given, and the codes [N, 16] it produced."""

    prompt: torch.Tensor  # [1, L, H] prompt embeddings
    text: torch.Tensor  # [1, T, H] trailing text, consumed one row per frame
    pad: torch.Tensor  # [1, 1, H] tts_pad, after the text runs out
    codes: torch.Tensor  # [N, 16] int64

    def text_for(self, frame: int) -> torch.Tensor:
        return self.text[:, frame:frame + 1] if frame < self.text.shape[1] else self.pad


def record(tts: MorphTTS, voice, text: str, frames: int, settings: GenerationSettings | None = None,
           hold_eos: bool = True) -> Recording:
    """Run upstream qwen-tts (the loaded precision) and keep its talker inputs and codes.

    settings: upstream's default sampling with seed 0 unless given; seq_groups is ignored.
    With hold_eos, exactly `frames` frames; without, up to `frames`, ending where upstream's would."""
    talker = tts.tts.model.talker
    seen = {}

    def generate(**kwargs):
        seen.update(kwargs)
        seen["result"] = type(talker).generate(talker, **kwargs)
        return seen["result"]

    settings = replace(settings or GenerationSettings(seed=0), max_new_tokens=frames)
    with tts.upstream(), eos_held_back(talker) if hold_eos else nullcontext():
        talker.generate = generate
        try:
            torch.manual_seed(settings.seed or 0)
            tts.tts.generate_voice_clone(text=text, language="English", voice_clone_prompt=[tts._prompt_item(voice)],
                                         **settings.upstream_kwargs(text))
        finally:
            vars(talker).pop("generate", None)
    codes = torch.stack([h[-1] for h in seen["result"].hidden_states if h[-1] is not None], dim=1)[0]
    if not hold_eos:  # upstream keeps the frames before the first EOS
        codes = codes[:int((codes[:, 0] == talker.config.codec_eos_token_id).int().cumsum(0).eq(0).sum())]
    if seen["inputs_embeds"].shape[0] != 1 or (hold_eos and codes.shape[0] != frames):
        raise RuntimeError(f"recording: expected one row of {frames} frames, got {tuple(codes.shape)}")
    return Recording(seen["inputs_embeds"], seen["trailing_text_hidden"], seen["tts_pad_embed"], codes)


# -- teacher-forced stacks ----------------------------------------------------------------
@dataclass
class Logits:
    """One stack's logits on one recording, on the CPU in float64 (a reference's digits are kept)."""

    talker: torch.Tensor  # [N, V_talker]
    groups: torch.Tensor  # [15, N, V]: the sequential passes, group g at row g - 1
    crossbar: dict  # k -> [15 - k, N, V]: groups k+1..15 read off group k's hidden state

    def at(self, k: int) -> torch.Tensor:
        """Groups 1..15 as a stack running seq_groups=k produces them."""
        return self.groups if k == 15 else torch.cat((self.groups[:k], self.crossbar[k]))


def _crossbar(hidden: torch.Tensor, cp, k: int) -> torch.Tensor:
    heads = torch.stack([cp.lm_head[g].weight for g in range(k, len(cp.lm_head))])
    return torch.einsum("bh,gvh->bgv", hidden, heads)[0]  # [15 - k, V]


def _step_input(talker, codes: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """The talker's input for a frame, as upstream sums it: code 0's and the 15 groups'
    embeddings, plus the frame's trailing text."""
    cp = talker.code_predictor
    embeds = [talker.model.codec_embedding(codes[:1])] + [cp.model.codec_embedding[g](codes[g + 1:g + 2])
                                                         for g in range(len(cp.model.codec_embedding))]
    return torch.cat(embeds).sum(0)[None, None] + text


def _collect(talker_logits, group_logits, hiddens, cp, ks) -> Logits:
    """Per-frame lists -> a Logits; hiddens[j][g] is the hidden state that produced group g + 1."""
    crossbar = {k: torch.stack([_crossbar(h[k - 1], cp, k) for h in hiddens], dim=1).double().cpu()
                for k in ks if k < 15}
    groups = torch.stack([torch.cat(f) for f in group_logits], dim=1)  # [15, N, V]
    return Logits(torch.cat(talker_logits).double().cpu(), groups.double().cpu(), crossbar)


def _prefill(talker, rec: Recording, dtype):
    """Upstream's talker prefill over the prompt: (cache, logits of frame 0's code 0, past hidden)."""
    from transformers.cache_utils import DynamicCache

    x = rec.prompt.to(dtype)
    n = x.shape[1]
    cache = DynamicCache()
    h = talker.model(inputs_embeds=x, attention_mask=torch.ones(1, n, dtype=torch.long, device=x.device),
                     past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(n, device=x.device)).last_hidden_state
    return cache, talker.codec_head(h)[:, -1], h[:, -1:]


def hf_stack(talker, rec: Recording, ks, dtype) -> Logits:
    """Upstream's HF layers, teacher forced, as qwen-tts's generate calls them."""
    from transformers.cache_utils import DynamicCache

    cp = talker.code_predictor
    dev = rec.prompt.device
    cache, logits, past = _prefill(talker, rec, dtype)
    n = rec.prompt.shape[1]
    talker_logits, group_logits, hiddens = [logits], [], []
    for j, codes in enumerate(rec.codes):
        # the code predictor's generate: a fresh cache, a 2-token prefill, one token per group
        pcache, x, frame_logits, frame_hidden, start = DynamicCache(), None, [], [], 0
        for g in range(15):
            x = torch.cat((past, talker.model.codec_embedding(codes[:1])[None]), 1) if g == 0 \
                else cp.model.codec_embedding[g - 1](codes[g:g + 1])[None]
            h = cp.model(inputs_embeds=cp.small_to_mtp_projection(x), past_key_values=pcache, use_cache=True,
                         cache_position=torch.arange(start, start + x.shape[1], device=dev)).last_hidden_state
            start += x.shape[1]
            frame_logits.append(cp.lm_head[g](h)[:, -1])  # upstream projects every position, keeps the last
            frame_hidden.append(h[:, -1])
        group_logits.append(frame_logits)
        hiddens.append(frame_hidden)
        if j + 1 < len(rec.codes):
            pos = n + j
            past = talker.model(inputs_embeds=_step_input(talker, codes, rec.text_for(j).to(dtype)),
                                attention_mask=torch.ones(1, pos + 1, dtype=torch.long, device=dev),
                                past_key_values=cache, use_cache=True,
                                cache_position=torch.tensor([pos], device=dev)).last_hidden_state
            talker_logits.append(talker.codec_head(past)[:, -1])
    return _collect(talker_logits, group_logits, hiddens, cp, ks)


class _Runner:
    """Runs a step op by op ("lean"), or captured once per key in a CUDA graph and replayed
    ("graphs", "fused"). A step reads only buffers that the caller refills before each run."""

    def __init__(self, mode: str):
        self.mode = mode
        self.entries = {}
        self.pool = torch.cuda.graph_pool_handle() if mode in runner.FAST_MODES else None

    def __call__(self, key, step):
        if self.mode == "lean":
            return step()
        if key not in self.entries:
            self.entries[key] = graphs.capture(step, self.pool)
        return tuple(t.clone() for t in self.entries[key].replay())  # the next replay overwrites them


def _cache_pairs(cache):
    """(keys, values) per layer of an HF DynamicCache, on transformers 4.57 and 5.x."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def lean_stack(talker, rec: Recording, ks, dtype, mode: str, overrides: dict | None = None) -> Logits:
    """The lean layers, teacher forced: upstream's prefill, then lean talker steps on static KV
    buffers and lean predictor passes. `overrides` replaces morph.decode.lean functions by name for the
    run (a deliberately worse rms_norm, say), to check that the gate catches it."""
    cp = talker.code_predictor
    dev = rec.prompt.device
    run = _Runner(mode)
    with ExitStack() as stack, torch.inference_mode():
        if overrides:
            stack.enter_context(mock.patch.multiple(lean, **overrides))
        t_stack = FusedStack(talker.model.layers, talker.model.norm, talker.config)
        p_stack = FusedStack(cp.model.layers, cp.model.norm, cp.config)
        stack.callback(t_stack.release)
        stack.callback(p_stack.release)
        tw, pw, td, pd = t_stack.weights(), p_stack.weights(), t_stack.dims, p_stack.dims
        proj = cp.small_to_mtp_projection
        proj_w, proj_b = (proj.weight, proj.bias) if isinstance(proj, torch.nn.Linear) else (None, None)

        cache, logits, past = _prefill(talker, rec, dtype)
        n = rec.prompt.shape[1]
        cap = n + len(rec.codes)
        tk = [torch.zeros(1, td.kv_heads, cap, td.head_dim, device=dev, dtype=dtype) for _ in tw]
        tv = [torch.zeros(1, td.kv_heads, cap, td.head_dim, device=dev, dtype=dtype) for _ in tw]
        for (k, v), kc, vc in zip(_cache_pairs(cache), tk, tv, strict=True):
            kc[:, :, :n].copy_(k)
            vc[:, :, :n].copy_(v)
        t_cos, t_sin = lean.rope_tables(talker.model.rotary_emb, cap, dev, dtype, multimodal=True)
        slot = torch.zeros(1, dtype=torch.long, device=dev)
        no_pads = torch.zeros(1, dtype=torch.long, device=dev)
        t_in = torch.zeros(1, 1, talker.config.hidden_size, device=dev, dtype=dtype)

        plen = len(cp.lm_head) + 1  # a 2-token prefill, then one slot per later group
        pk = [torch.zeros(1, pd.kv_heads, plen, pd.head_dim, device=dev, dtype=dtype) for _ in pw]
        pv = [torch.zeros(1, pd.kv_heads, plen, pd.head_dim, device=dev, dtype=dtype) for _ in pw]
        p_cos, p_sin = lean.rope_tables(cp.model.rotary_emb, plen, dev, dtype, multimodal=False)
        no_lo = torch.zeros(1, dtype=torch.long, device=dev)
        idx = [torch.arange(2, device=dev)] + [torch.tensor([g + 1], device=dev) for g in range(1, 15)]
        p_in = [torch.zeros(1, 2, talker.config.hidden_size, device=dev, dtype=dtype)] + \
            [torch.zeros(1, 1, talker.config.hidden_size, device=dev, dtype=dtype) for _ in range(1, 15)]
        talker_fn, pass_fn = lean.talker_pass, lean.predictor_pass
        fused = mode == "fused"

        def predictor_step(g):
            h = pass_fn(p_in[g], proj_w, proj_b, pw, cp.model.norm.weight, pk, pv, p_cos, p_sin, idx[g], no_lo,
                        pd, fused)[:, -1]
            return h, F.linear(h, cp.lm_head[g].weight)

        def talker_step():
            h = talker_fn(t_in, tw, talker.model.norm.weight, tk, tv, t_cos, t_sin, slot, slot, no_pads, td, fused)
            return h, F.linear(h[:, -1], talker.codec_head.weight)

        talker_logits, group_logits, hiddens = [logits], [], []
        for j, codes in enumerate(rec.codes):
            frame_logits, frame_hidden = [], []
            for g in range(15):
                p_in[g].copy_(torch.cat((past, F.embedding(codes[:1], talker.model.codec_embedding.weight)[None]), 1)
                              if g == 0 else F.embedding(codes[g:g + 1], cp.model.codec_embedding[g - 1].weight)[None])
                h, lg = run(("predictor", g), lambda: predictor_step(g))
                frame_logits.append(lg)
                frame_hidden.append(h)
            group_logits.append(frame_logits)
            hiddens.append(frame_hidden)
            if j + 1 < len(rec.codes):
                t_in.copy_(_step_input(talker, codes, rec.text_for(j).to(dtype)))
                slot.fill_(n + j)
                past, lg = run(("talker",), talker_step)
                talker_logits.append(lg)
        return _collect(talker_logits, group_logits, hiddens, cp, ks)
