"""One left-padded prompt batch (an x-vector line and a longer ICL line), as the continuous batch prefills it, and
upstream's talker forward over it: what tests/morph/decode/test_prefill.py and tests/gpu/test_prefill.py compare
morph/decode/lean.py's lean_prefill with, and what they and test_prefill_graphs.py run through the buckets of
morph/decode/prefill_graphs.py."""

from __future__ import annotations

import numpy as np
import torch

from morph.decode import lean
from morph.prompts import batch_inputs, make_rows, prompt_inputs, row_prompts
from morph.reference.loop import prefill
from morph.render import Line
from morph.settings import GenerationSettings

SR = 24000


def cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of an HF DynamicCache, across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))



def prompt(tts) -> dict:
    t = np.arange(2 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    lines = [Line("Hello there, a short one.", tts.make_voice(wave, SR), "English"),
             Line("A much longer line of text, which pads the other one on its left.",
                  tts.make_voice(wave, SR, transcript="A short reference sentence."), "English")]
    settings = GenerationSettings()
    rows = make_rows(tts, lines, settings, "test", True)
    model = tts.tts
    kwargs = model._merge_generate_kwargs(**settings.upstream_kwargs(rows[1].text))
    return batch_inputs(model.model, row_prompts(model.model, ["English"] * 2, **prompt_inputs(tts, rows)),
                        min_new_tokens=settings.min_new_tokens, **kwargs)


def both(tts):
    """(upstream's forward, lean_prefill, each row's left padding) over prompt(tts)."""
    p, loop = prompt(tts), tts.patch.loop
    embeds, mask = p["inputs_embeds"], p["attention_mask"]
    with torch.inference_mode():
        upstream = prefill(loop.talker, embeds, mask, p["trailing_text_hidden"], p["tts_pad_embed"])
        ours = alone(loop, embeds, mask, tables_of(tts, embeds))
    pads = (embeds.shape[1] - mask.sum(-1)).tolist()
    return upstream, ours, pads


def worst(upstream, ours, pads) -> dict:
    """The largest differences, over each row's own tokens (its padding is never read), relative to the largest
    value of each."""
    def rel(a, b):
        return ((a.float() - b.float()).abs().max() / a.float().abs().max()).item()

    kv = max(rel(k[r, :, p:], k2[r, :, p:]) for (k, v), (k2, v2) in zip(cache_tensors(upstream.past_key_values), ours.kv)
             for r, p in enumerate(pads) for k, k2 in ((k, k2), (v, v2)))
    return dict(kv=kv, logits=rel(upstream.logits[:, -1], ours.logits),
                hidden=rel(upstream.past_hidden, ours.past_hidden))


def tables_of(tts, embeds):
    """The rotary tables (cos, sin) for a prompt batch as long as `embeds`."""
    loop = tts.patch.loop
    return lean.rope_tables(loop.talker.model.rotary_emb, embeds.shape[1], tts.device, embeds.dtype, multimodal=True)


def slice_of(tts):
    """(loop, inputs_embeds, attention_mask, rotary tables) of prompt(tts): a left-padded two-row slice."""
    p = prompt(tts)
    return tts.patch.loop, p["inputs_embeds"], p["attention_mask"], tables_of(tts, p["inputs_embeds"])


def alone(loop, embeds, mask, tables):
    """lean_prefill over the slice alone, op by op."""
    return lean.lean_prefill(embeds, mask, loop.stack.weights(), loop.talker.model.norm.weight,
                        loop.talker.codec_head.weight, *tables, loop.stack.dims)


def assert_same(got, want, tol: float = 1e-5):
    """Two prefills' outputs equal to `tol` (relative and absolute)."""
    assert len(got.kv) == len(want.kv)
    for (k, v), (k2, v2) in zip(got.kv, want.kv, strict=True):
        torch.testing.assert_close(k, k2, rtol=tol, atol=tol)
        torch.testing.assert_close(v, v2, rtol=tol, atol=tol)
    torch.testing.assert_close(got.logits, want.logits, rtol=tol, atol=tol)
    torch.testing.assert_close(got.past_hidden, want.past_hidden, rtol=tol, atol=tol)
