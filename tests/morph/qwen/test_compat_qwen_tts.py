"""morph.qwen.compat_qwen_tts: each wrapper is fed a fake with the 5.x shape, so they work on any transformers
(tests/morph/qwen/test_compat.py checks them end to end on a tiny model)."""

import types

import torch

from morph.qwen import compat_qwen_tts as shims


def test_legacy_mask_kwargs_are_translated_for_a_5x_signature():
    seen = {}

    def create_causal_mask(config, inputs_embeds, attention_mask, past_key_values, position_ids=None):
        seen.update(config=config, inputs_embeds=inputs_embeds, past_key_values=past_key_values)
        return "mask"

    wrapped = shims.accept_legacy_mask_kwargs(create_causal_mask)
    out = wrapped(config="c", input_embeds="e", attention_mask=None, cache_position="p", past_key_values="kv")
    assert out == "mask" and seen == {"config": "c", "inputs_embeds": "e", "past_key_values": "kv"}


def test_legacy_mask_kwargs_pass_through_for_a_457_signature():
    def create_causal_mask(config, input_embeds, attention_mask, cache_position, past_key_values, position_ids=None):
        return input_embeds, cache_position

    wrapped = shims.accept_legacy_mask_kwargs(create_causal_mask)
    kwargs = dict(config=None, input_embeds="e", attention_mask=None, cache_position="p", past_key_values=None)
    assert wrapped(**kwargs) == ("e", "p")


def test_legacy_mask_kwargs_name_the_cache_as_524_does():
    seen = {}

    def create_causal_mask(config, inputs_embeds, attention_mask, cache, position_ids=None):  # 5.24
        seen.update(inputs_embeds=inputs_embeds, cache=cache)
        return "mask"

    wrapped = shims.accept_legacy_mask_kwargs(create_causal_mask)
    out = wrapped(config="c", input_embeds="e", attention_mask=None, cache_position="p", past_key_values="kv")
    assert out == "mask" and seen == {"inputs_embeds": "e", "cache": "kv"}


class _FakeCache:
    def get_seq_length(self):
        return 7


def test_cache_position_is_filled_in_from_the_cache_length():
    def prepare(self, input_ids, **kwargs):  # a 5.x prepare_inputs_for_generation: no cache_position
        return {"input_ids": input_ids, "inputs_embeds": None, "past_key_values": _FakeCache()}

    wrapped = shims.pass_cache_position(prepare)
    inputs = wrapped(None, torch.zeros(2, 3, dtype=torch.long))
    assert inputs["cache_position"].tolist() == [7, 8, 9]

    def prepare_457(self, input_ids, **kwargs):  # 4.57 passed it: keep theirs
        return {"input_ids": input_ids, "cache_position": torch.tensor([42])}

    assert shims.pass_cache_position(prepare_457)(None, torch.zeros(1, 1)).__getitem__("cache_position").tolist() == [42]

    def prepare_524(self, input_ids, **kwargs):  # 5.24 passes the cache as `cache`
        return {"input_ids": input_ids, "inputs_embeds": None, "cache": _FakeCache()}

    inputs = shims.pass_cache_position(prepare_524)(None, torch.zeros(2, 3, dtype=torch.long))
    assert inputs["cache_position"].tolist() == [7, 8, 9]


def test_guarded_init_weights_keeps_loaded_tensors_and_refills_rope_buffers():
    calls = []
    guarded = shims.guard_init_weights(lambda self, module: calls.append(module))

    loaded = torch.nn.Linear(2, 2)
    for p in loaded.parameters():
        p._is_hf_initialized = True  # what 5.x's loader sets on tensors it read from the checkpoint
    fresh = torch.nn.Linear(2, 2)
    guarded(None, loaded)
    guarded(None, fresh)
    assert calls == [fresh]

    config = types.SimpleNamespace(rope_theta=10000.0, head_dim=8, hidden_size=32, num_attention_heads=4)
    rotary = torch.nn.Module()
    rotary.config, rotary.rope_init_fn = config, shims.compute_default_rope_parameters
    rotary.register_buffer("inv_freq", torch.full((4,), float("nan")), persistent=False)
    guarded(None, rotary)
    assert torch.equal(rotary.inv_freq, 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    assert calls == [fresh]


def test_rope_parameters_saved_by_5x_load_as_rope_scaling():
    seen = {}

    def init(self, rope_theta=10000, rope_scaling=None, **kwargs):  # the shape of qwen-tts's talker config
        seen.update(rope_theta=rope_theta, rope_scaling=rope_scaling, kwargs=kwargs)

    wrapped = shims.accept_saved_rope_parameters(init)
    wrapped(None, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6})
    assert seen == {"rope_theta": 1e6, "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]}, "kwargs": {}}
    wrapped(None, rope_theta=5.0, rope_scaling={"rope_type": "default"})  # a 4.57 config.json: untouched
    assert seen == {"rope_theta": 5.0, "rope_scaling": {"rope_type": "default"}, "kwargs": {}}


def test_default_rope_matches_transformers_457_where_it_exists():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = types.SimpleNamespace(rope_theta=1e6, head_dim=16, hidden_size=64, num_attention_heads=4)
    ours, scale = shims.compute_default_rope_parameters(config)
    assert scale == 1.0 and ours.shape == (8,)
    if "default" in ROPE_INIT_FUNCTIONS:  # 4.x
        theirs, _ = ROPE_INIT_FUNCTIONS["default"](config)
        assert torch.equal(ours, theirs)

