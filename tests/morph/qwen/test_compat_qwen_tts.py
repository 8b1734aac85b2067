"""morph.qwen.compat_qwen_tts: each wrapper and shim is fed a fake with the 5.x shape, so they work and the feature
detection is exercised on any transformers (tests/morph/qwen/test_compat.py checks them end to end on a tiny model)."""

import logging
import types
from dataclasses import dataclass, fields

import pytest
import torch
from transformers.utils import ModelOutput

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


def _decorator_5x(func):  # the shape of check_model_inputs on transformers >= 5.4
    func.decorated = True
    return func


def _decorator_457(tie_last_hidden_states=True):  # the shape on 4.57: always called
    return _decorator_5x


def test_feature_detection_tells_the_two_decorator_signatures_apart():
    assert shims._needs_func_argument(_decorator_5x)
    assert not shims._needs_func_argument(_decorator_457)


def test_wrapped_decorator_accepts_both_call_forms():
    wrapped = shims.accepts_both_call_forms(_decorator_5x)

    @wrapped
    def bare():
        pass

    @wrapped()
    def called():
        pass

    @wrapped(tie_last_hidden_states=False)
    def with_kwargs():
        pass

    assert bare.decorated and called.decorated and with_kwargs.decorated
    with pytest.raises(TypeError):
        _decorator_5x()  # what qwen-tts's `@check_model_inputs()` hits without the shim


@pytest.fixture(autouse=True)
def _own_rebinding_record(monkeypatch):
    """Each test's check_model_inputs rebinding is its own (monkeypatch restores transformers' attribute)."""
    monkeypatch.setattr(shims, "_rebound", [])


def test_check_model_inputs_shim_patches_a_5x_decorator_once(monkeypatch):
    from transformers.utils import generic

    monkeypatch.setattr(generic, "check_model_inputs", _decorator_5x)
    assert shims._shim_check_model_inputs()
    patched = generic.check_model_inputs
    assert patched is not _decorator_5x
    assert patched()(lambda: None).decorated
    assert not shims._shim_check_model_inputs()  # idempotent
    assert generic.check_model_inputs is patched


def test_check_model_inputs_shim_leaves_a_457_decorator_alone(monkeypatch):
    from transformers.utils import generic

    monkeypatch.setattr(generic, "check_model_inputs", _decorator_457)
    assert not shims._shim_check_model_inputs()
    assert generic.check_model_inputs is _decorator_457


def test_check_model_inputs_shim_restores_a_removed_decorator(monkeypatch):
    from transformers.utils import generic

    monkeypatch.delattr(generic, "check_model_inputs", raising=False)
    monkeypatch.setattr(generic, "merge_with_config_defaults", _decorator_5x, raising=False)
    assert shims._shim_check_model_inputs()
    assert generic.check_model_inputs()(lambda: None).decorated


def test_check_model_inputs_is_given_back_after_the_import(monkeypatch):
    from transformers.utils import generic

    monkeypatch.setattr(generic, "check_model_inputs", _decorator_5x)
    assert shims._shim_check_model_inputs() and generic.check_model_inputs is not _decorator_5x
    shims.restore_check_model_inputs()
    assert generic.check_model_inputs is _decorator_5x
    monkeypatch.delattr(generic, "check_model_inputs")
    monkeypatch.setattr(generic, "merge_with_config_defaults", _decorator_5x, raising=False)
    assert shims._shim_check_model_inputs()
    shims.restore_check_model_inputs()
    assert not hasattr(generic, "check_model_inputs")  # removed again, as this transformers has it


@dataclass
class _TalkerOutput(ModelOutput):  # the shape of qwen-tts's two talker outputs
    logits: torch.Tensor | None = None
    past_key_values: object = None
    hidden_states: tuple | None = None


@pytest.fixture
def deprecation_logs(monkeypatch):
    """What transformers logs once per process (5.24's note on the old cache name among them), every time."""
    said = []

    def warning_once(self, msg, *args, **kwargs):
        said.append(msg % args if args else msg)

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once)
    return said


def test_output_with_cache_field_keeps_past_key_values_as_a_silent_alias(deprecation_logs):
    output = shims.with_cache_field(_TalkerOutput)
    assert output.__name__ == "_TalkerOutput"
    assert [f.name for f in fields(output)] == ["logits", "cache", "hidden_states"]
    logits = torch.zeros(1)
    out = output(logits=logits, past_key_values="kv")  # how qwen-tts builds it
    assert out.cache == "kv" and out.past_key_values == "kv"  # and how qwen-tts and the pack read it
    assert "cache" in out and out["cache"] == "kv" and list(out.keys()) == ["logits", "cache"]  # how generate reads it
    assert out.to_tuple() == (logits, "kv")
    assert output(logits, "kv").cache == "kv" and output(cache="kv").past_key_values == "kv"
    with pytest.raises(TypeError, match="both"):
        output(cache="a", past_key_values="b")
    assert deprecation_logs == []


def test_forward_takes_the_cache_as_524s_generate_passes_it():
    def forward(self, input_ids=None, past_key_values=None, **kwargs):  # qwen-tts's: the rest goes to its layers
        return past_key_values, kwargs

    wrapped = shims.accept_cache_kwarg(forward)
    assert wrapped(None, cache="kv", use_cache=True) == ("kv", {"use_cache": True})
    assert wrapped(None, past_key_values="kv") == ("kv", {})  # the pack's own calls, and 4.57's generate
    with pytest.raises(TypeError, match="both"):
        wrapped(None, cache="a", past_key_values="b")
