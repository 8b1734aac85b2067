"""The lean layers: HF's math op for op, fused weights that are views, and the talker loop.

All on CPU in fp32: the lean stack must agree with the HF decoder layers to rounding,
and the talker loop built on it (mode "lean") must give upstream's codes.
"""

import gc
import weakref

import pytest
import torch

from morph.decode import lean
from morph.decode.fused_stack import FusedStack
from morph.settings import GenerationSettings, Sampling

from morph.render import BatchTTS, Line

from ..helpers import storage_bytes


def _hf_run(layers, norm, x, positions, rotary, multimodal):
    """The HF layers with a DynamicCache: the reference the lean stack must match."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    outs = []
    for pos in positions:
        pids = torch.tensor(pos)
        rp = pids.view(1, 1, -1).expand(3, 1, -1) if multimodal else pids.unsqueeze(0)
        cos, sin = rotary(x, rp)
        h = x[:, pos]
        for layer in layers:
            h = layer(h, attention_mask=None, position_ids=pids.unsqueeze(0), past_key_values=cache, use_cache=True,
                      cache_position=torch.tensor(pos), position_embeddings=(cos, sin))
            h = h[0] if isinstance(h, tuple) else h
        outs.append(norm(h))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("which", ["predictor", "talker"])
def test_lean_stack_matches_hf_layers(tiny_tts, which):
    talker = tiny_tts.tts.model.talker
    model = talker.code_predictor.model if which == "predictor" else talker.model
    cfg = model.config
    stack = FusedStack(model.layers, model.norm, cfg)
    d = stack.dims
    length, batch = 8, 2
    x = torch.randn(batch, length, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    # HF: a 2-token prefill, then one token at a time
    expected = _hf_run(model.layers, model.norm, x, [[0, 1]] + [[p] for p in range(2, 6)], model.rotary_emb,
                       multimodal=which == "talker")

    ks = [torch.zeros(batch, d.kv_heads, length, d.head_dim) for _ in model.layers]
    vs = [torch.zeros(batch, d.kv_heads, length, d.head_dim) for _ in model.layers]
    cos, sin = lean.rope_tables(model.rotary_emb, length, x.device, x.dtype, multimodal=which == "talker")
    causal = torch.zeros(batch, dtype=torch.long)
    outs = []
    for pos in [[0, 1]] + [[p] for p in range(2, 6)]:
        idx = torch.tensor(pos)
        outs.append(lean.predictor_pass(x[:, pos], None, None, stack.weights(), model.norm.weight, ks, vs, cos, sin,
                                        idx, causal, d))
    got = torch.cat(outs, dim=1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    stack.release()


def test_talker_pass_masks_left_padding(tiny_tts):
    """A left-padded row attends from its first real slot and rotates from position 0."""
    model = tiny_tts.tts.model.talker.model
    cfg = model.config
    stack = FusedStack(model.layers, model.norm, cfg)
    d, length = stack.dims, 8
    x = torch.randn(1, 4, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    cos, sin = lean.rope_tables(model.rotary_emb, length, x.device, x.dtype, multimodal=True)

    def run(prefix_pads):
        ks = [torch.zeros(1, d.kv_heads, length, d.head_dim) for _ in model.layers]
        vs = [torch.zeros(1, d.kv_heads, length, d.head_dim) for _ in model.layers]
        for v in ks + vs:  # garbage in the padded slots must not leak in
            v[:, :, :prefix_pads] = 7.0
        out = []
        for i in range(4):
            slot = torch.tensor([prefix_pads + i])
            out.append(lean.talker_pass(x[:, i:i + 1], stack.weights(), model.norm.weight, ks, vs, cos, sin, slot,
                                        torch.tensor([i]), torch.tensor([prefix_pads]), d))
        return torch.cat(out, dim=1)

    torch.testing.assert_close(run(3), run(0), rtol=1e-5, atol=1e-5)
    stack.release()


def test_fused_weights_are_views_and_follow_a_cast(tiny_dir):
    from morph.qwen.compat import import_qwen_tts

    tts = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(tiny_dir), dtype=torch.float32)
    model = tts.model.talker.model
    before = storage_bytes(tts.model)
    stack = FusedStack(model.layers, model.norm, model.config)
    ws = stack.weights()
    attn = model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == ws[0].wqkv.untyped_storage().data_ptr()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == ws[0].wqkv.untyped_storage().data_ptr()
    assert storage_bytes(tts.model) == before  # fused, not copied
    print_before = stack.fingerprint()
    assert stack.fingerprint() == print_before  # stable while nothing moves

    model.to(torch.float64)  # a memory manager casts or moves the model
    ws = stack.weights()
    assert ws[0].wqkv.dtype == torch.float64 and stack.fingerprint() != print_before
    assert attn.k_proj.weight.data_ptr() == ws[0].wqkv[attn.q_proj.weight.shape[0]:].data_ptr()

    stack.release()
    assert len({m.weight.untyped_storage().data_ptr() for m in (attn.q_proj, attn.k_proj, attn.v_proj)}) == 3


def test_release_frees_each_layers_fused_weights_before_copying_the_next(tiny_tts, monkeypatch):
    """Release copies the projections out of the fused tensors a layer at a time and lets each layer's go first: on a
    card a render filled, copying the whole stack's before freeing any ran out of memory (the 1.7B at 6 GB,
    bench/results/h200-2026-11-28d/NOTES.md)."""
    from morph.decode import fused_stack

    model = tiny_tts.tts.model.talker.model
    stack = FusedStack(model.layers, model.norm, model.config)
    stack.weights()
    fused = [weakref.ref(t) for pair in stack._fused for t in pair]
    unfuse, calls = fused_stack.unfuse, []

    def unfuse_one(linears):
        gc.collect()
        calls.append(sum(ref() is not None for ref in fused))
        unfuse(linears)

    monkeypatch.setattr(fused_stack, "unfuse", unfuse_one)
    stack.release()
    gc.collect()
    # before layer i's qkv and gate/up are copied, layer i's two tensors and the later layers' are all that live
    layers = len(model.layers)
    assert calls == [n for i in range(layers) for n in (2 * (layers - i), 2 * (layers - i))]
    assert all(ref() is None for ref in fused)


@pytest.mark.parametrize("k, icl", [(15, False), (15, True), (5, False)], ids=["k15-xvector", "k15-icl", "k5-xvector"])
def test_the_lean_layers_give_the_eager_codes(tiny_tts, ref_audio, k, icl):
    """The engine on the lean layers, op by op on the CPU, speaks greedy codes the reference speaks on the
    checkpoint's own HF layers (eager mode's static batch). (Sampled, the two draw from different streams: each row
    its own on the engine, torch's in eager, as upstream.)"""
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence." if icl else None)
    settings = GenerationSettings(seq_groups=k, do_sample=False, subtalker=Sampling(do_sample=False),
                                  max_new_tokens=16)
    out = {}
    try:
        for mode in ("eager", "lean"):
            tiny_tts.patch.mode = mode
            out[mode] = BatchTTS(tiny_tts).codes([Line("Hello world, this is a test.", voice, "English")], settings)[0]
            assert tiny_tts.patch.last_run["mode"] == mode
    finally:
        tiny_tts.patch.mode = "auto"
        tiny_tts.release_device_state()
    assert out["eager"].shape[0] > 3
    assert torch.equal(out["eager"], out["lean"])
