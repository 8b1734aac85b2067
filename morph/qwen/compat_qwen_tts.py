"""The shims that run qwen-tts under transformers 5.x; morph/qwen/compat.py applies them. `BEFORE_IMPORT` only adds
or widens transformers names before ``import qwen_tts`` (check_model_inputs is given back when it ends); `SHIMS` then
patch qwen-tts's own classes and globals, which nothing else sees. Each, with the release it answers and why:
  check_model_inputs  5.2+   qwen-tts calls ``@check_model_inputs()``: 5.2/5.3 removed it, 5.4's needs ``func``.
  mimi_keys           5.21+  Mimi's key renaming skips qwen-tts's subclass: the 12 Hz encoder loaded random weights.
  pad_token_id        5.0+   no longer a config default; the talker and code predictor read it when built.
  rope_parameters     5.0+   ``rope_scaling`` is saved as ``rope_parameters``: see accept_saved_rope_parameters.
  rope_default        5.0+   ``ROPE_INIT_FUNCTIONS["default"]`` is gone; qwen-tts looks it up for every RoPE.
  tied_weights_keys   5.0+   must be a dict; qwen-tts's lists (which tie nothing) crash ``save_pretrained``.
  init_weights        5.0+   RoPE inv_freq left unset after loading (before 5.13, weights re-randomised): wrong audio.
  mask_kwargs         5.9+   create_causal_mask renamed input_embeds and (5.24) past_key_values, dropped cache_position.
  cache_position      5.4+   generate stopped passing it; the talker's multimodal RoPE positions key on it.
  mimi_properties     5.21+  ``upsample``/``decoder_transformer`` became read-only; qwen-tts's encoder sets None.
  output_cache        5.24+  outputs' past_key_values became cache: qwen-tts's get that field, with a silent alias.
  forward_cache       5.24+  generate passes cache=, which qwen-tts's forward ignored: an empty cache each step."""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import inspect
import sys

from .marks import mark, marked, note_foreign_wrapper

_MODELS = "qwen_tts.core.models.modeling_qwen3_tts"
_CONFIGS = "qwen_tts.core.models.configuration_qwen3_tts"
_TOKENIZER_12HZ = "qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2"
_TOKENIZER_12HZ_CONFIG = "qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2"
_TOKENIZER_25HZ = "qwen_tts.core.tokenizer_25hz.modeling_qwen3_tts_tokenizer_v1"
_TALKER_CONFIGS = ("Qwen3TTSTalkerConfig", "Qwen3TTSTalkerCodePredictorConfig")
_GENERATORS = ("Qwen3TTSTalkerForConditionalGeneration", "Qwen3TTSTalkerCodePredictorModelForConditionalGeneration")


def _classes(module: str, *names: str) -> list[type]:
    """The named classes of a qwen_tts module, once it has been imported."""
    loaded = sys.modules.get(module)
    return [getattr(loaded, name) for name in names] if loaded is not None else []


def _wrap_methods(classes, attr: str, wrap) -> bool:
    """Replace `attr` on each class with wrap(it), unless already ours; note other packs' wrappers."""
    done = False
    for cls in classes:
        method = getattr(cls, attr)
        if not marked(method):
            note_foreign_wrapper(method, f"{cls.__name__}.{attr}")
            setattr(cls, attr, wrap(method))
            done = True
    return done


def accepts_both_call_forms(decorator):
    """Wrap a decorator that requires ``func`` so that ``@decorator()`` (kwargs ignored) also works."""

    @functools.wraps(decorator)
    def wrapper(func=None, **_ignored):
        return decorator if func is None else decorator(func)

    return mark(wrapper)


def _needs_func_argument(decorator) -> bool:
    params = list(inspect.signature(decorator).parameters.values())
    return bool(params) and params[0].default is inspect.Parameter.empty


_MISSING = object()
_rebound: list = []  # (the original check_model_inputs, or _MISSING) while our wrapper is bound


def _shim_check_model_inputs() -> bool:
    from transformers.utils import generic

    current = getattr(generic, "check_model_inputs", None)
    if current is None:
        # 5.2/5.3 removed it; 5.4 brought it back as an alias of merge_with_config_defaults. Do the same.
        current = getattr(generic, "merge_with_config_defaults", None)
        if current is None:
            return False
    elif marked(current) or not _needs_func_argument(current):
        return False
    _rebound.append(generic.__dict__.get("check_model_inputs", _MISSING))
    generic.check_model_inputs = accepts_both_call_forms(current)
    return True


def restore_check_model_inputs() -> None:
    """Give transformers its check_model_inputs back once qwen-tts's classes (which keep the wrapper) are defined."""
    from transformers.utils import generic

    while _rebound:
        original = _rebound.pop()
        if original is _MISSING:
            generic.__dict__.pop("check_model_inputs", None)
        else:
            generic.check_model_inputs = original


def _shim_mimi_keys() -> bool:
    try:
        from transformers import conversion_mapping as cm
    except ImportError:  # 4.x: no conversion mappings, and the Mimi layout is the old one
        return False
    register = getattr(cm, "register_checkpoint_conversion_mapping", None)
    mimi = cm.get_checkpoint_conversion_mapping("MimiModel")
    if register is None or mimi is None:
        return False
    if cm.get_checkpoint_conversion_mapping("Qwen3TTSTokenizerV2Encoder") is not None:
        return False
    register("Qwen3TTSTokenizerV2Encoder", mimi)
    return True


BEFORE_IMPORT = {"check_model_inputs": _shim_check_model_inputs, "mimi_keys": _shim_mimi_keys}


def _shim_pad_token_id() -> bool:
    from transformers import PretrainedConfig

    if hasattr(PretrainedConfig(), "pad_token_id"):
        return False
    done = False
    for cls in _classes(_CONFIGS, *_TALKER_CONFIGS):
        if "pad_token_id" not in cls.__dict__:
            cls.pad_token_id = None  # 4.57's default; a value in config.json still wins (instance attribute)
            done = True
    return done


def accept_saved_rope_parameters(init):
    """Wrap a qwen-tts config ``__init__`` so a config.json written by 5.x loads like one written by 4.57: unwrapped,
    its own ``rope_scaling=None`` overwrites the saved ``rope_parameters``, losing the talker's mrope_section."""
    params = inspect.signature(init).parameters

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        rope = kwargs.pop("rope_parameters", None)
        if isinstance(rope, dict):
            if "rope_theta" in params and "rope_theta" not in kwargs and "rope_theta" in rope:
                kwargs["rope_theta"] = rope["rope_theta"]
            if "rope_scaling" in params and kwargs.get("rope_scaling") is None:
                kwargs["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}  # as 4.57 saved it
        init(self, *args, **kwargs)

    return mark(__init__)


def _shim_rope_parameters() -> bool:
    from transformers import PretrainedConfig

    if not isinstance(inspect.getattr_static(PretrainedConfig, "rope_scaling", None), property):  # 4.x
        return False
    targets = (_classes(_CONFIGS, *_TALKER_CONFIGS)
               + _classes(_TOKENIZER_12HZ_CONFIG, "Qwen3TTSTokenizerV2DecoderConfig"))
    return _wrap_methods(targets, "__init__", accept_saved_rope_parameters)


def compute_default_rope_parameters(config, device=None, seq_len=None, **_):
    """transformers 4.57.3's ``_compute_default_rope_parameters`` (plain RoPE), removed in 5.0."""
    import torch

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (config.rope_theta ** exponents), 1.0


def _shim_rope_default() -> bool:
    done = False
    for module in map(sys.modules.get, (_MODELS, _TOKENIZER_12HZ)):
        table = getattr(module, "ROPE_INIT_FUNCTIONS", None)
        if table is None or "default" in table:
            continue
        # A view over transformers' live table plus "default", seen only by this qwen_tts module.
        module.ROPE_INIT_FUNCTIONS = collections.ChainMap({"default": compute_default_rope_parameters}, table)
        done = True
    return done


def _shim_tied_weights_keys() -> bool:
    from transformers import PreTrainedModel

    if not hasattr(PreTrainedModel, "get_expanded_tied_weights_keys"):  # 4.x: lists are the format
        return False
    done = False
    for module in map(sys.modules.get, (_MODELS, _TOKENIZER_12HZ, _TOKENIZER_25HZ)):
        for cls in vars(module).values() if module else ():
            if isinstance(cls, type) and isinstance(cls.__dict__.get("_tied_weights_keys"), list):
                cls._tied_weights_keys = None
                done = True
    return done


def guard_init_weights(init_weights):
    """Wrap a qwen-tts ``_init_weights`` for transformers 5's load-then-initialise order."""

    @functools.wraps(init_weights)
    def _init_weights(self, module):
        if hasattr(module, "rope_init_fn") and hasattr(module, "inv_freq"):
            # Non-persistent buffer: not in the checkpoint, and 5.x does not keep the value computed in __init__.
            inv_freq, _ = module.rope_init_fn(module.config, module.inv_freq.device)
            module.inv_freq.copy_(inv_freq)
            module.original_inv_freq = module.inv_freq
            return
        own = list(module.parameters(recurse=False))
        if own and all(getattr(p, "_is_hf_initialized", False) for p in own):
            return  # loaded from the checkpoint (4.57 skipped such modules too)
        init_weights(self, module)

    return mark(_init_weights)


def _shim_init_weights() -> bool:
    if importlib.util.find_spec("transformers.initialization") is None:  # 4.x: initialise, then load
        return False
    targets = (_classes(_MODELS, "Qwen3TTSPreTrainedModel", "Qwen3TTSTalkerTextPreTrainedModel")
               + _classes(_TOKENIZER_12HZ, "Qwen3TTSTokenizerV2DecoderPreTrainedModel"))
    return _wrap_methods(targets, "_init_weights", guard_init_weights)


def accept_legacy_mask_kwargs(create_mask):
    """Let a 5.x ``create_*_mask`` take 4.57's ``input_embeds=``, ``cache_position=`` and ``past_key_values=``."""
    params = inspect.signature(create_mask).parameters

    @functools.wraps(create_mask)
    def wrapper(*args, **kwargs):
        if "input_embeds" in kwargs and "input_embeds" not in params:
            kwargs["inputs_embeds"] = kwargs.pop("input_embeds")
        if "past_key_values" in kwargs and "past_key_values" not in params and "cache" in params:
            kwargs["cache"] = kwargs.pop("past_key_values")  # 5.24's name (the old one warns until 5.40)
        if "cache_position" not in params:
            # 5.x derives it from past_key_values; qwen-tts's is always arange(past_len, past_len + q_len)
            kwargs.pop("cache_position", None)
        return create_mask(*args, **kwargs)

    return mark(wrapper)


def _shim_mask_kwargs() -> bool:
    done = False
    for name in (_MODELS, _TOKENIZER_12HZ):
        module = sys.modules.get(name)
        for attr in ("create_causal_mask", "create_sliding_window_causal_mask"):
            fn = getattr(module, attr, None)
            if fn is None or marked(fn):
                continue
            if {"input_embeds", "cache_position", "past_key_values"} <= inspect.signature(fn).parameters.keys():
                continue
            note_foreign_wrapper(fn, f"{name}.{attr}")
            setattr(module, attr, accept_legacy_mask_kwargs(fn))
            done = True
    return done


def pass_cache_position(prepare_inputs_for_generation):
    """Wrap ``prepare_inputs_for_generation`` to pass ``cache_position`` again, as 4.57's generate did."""
    import torch

    @functools.wraps(prepare_inputs_for_generation)
    def wrapper(self, *args, **kwargs):
        inputs = prepare_inputs_for_generation(self, *args, **kwargs)
        if inputs.get("cache_position") is None:
            past = inputs.get("cache", inputs.get("past_key_values"))  # 5.24 renamed it
            seen = past.get_seq_length() if past is not None else 0
            new = inputs["inputs_embeds"] if inputs.get("inputs_embeds") is not None else inputs["input_ids"]
            inputs["cache_position"] = torch.arange(seen, seen + new.shape[1], device=new.device)
        return inputs

    return mark(wrapper)


def _shim_cache_position() -> bool:
    from transformers import GenerationMixin

    if "cache_position" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters:
        return False
    return _wrap_methods(_classes(_MODELS, *_GENERATORS), "prepare_inputs_for_generation", pass_cache_position)


def _shim_mimi_properties() -> bool:
    done = False
    for encoder in _classes(_TOKENIZER_12HZ, "Qwen3TTSTokenizerV2Encoder"):
        for attr in ("upsample", "decoder_transformer"):
            inherited = inspect.getattr_static(encoder, attr, None)
            if isinstance(inherited, property) and inherited.fset is None:
                # The encoder sets these to None to drop Mimi's decoder half; 5.x derives them from
                # self.decoder, which it also sets to None. Reads give None, as on 4.57.
                setattr(encoder, attr, property(lambda self: None, lambda self, value: None))
                done = True
    return done


def alias_past_key_values(output):
    """Let a ModelOutput dataclass with a ``cache`` field take and give its cache as ``past_key_values`` too, without
    5.24's deprecation log (qwen-tts builds and reads its outputs under that name only)."""
    generated = output.__dict__["__init__"]
    generated = getattr(generated, "__wrapped__", generated)  # the dataclass's, inside the metaclass's renaming

    @functools.wraps(generated)
    def __init__(self, *args, **kwargs):
        if "past_key_values" in kwargs:
            if "cache" in kwargs:
                raise TypeError(f"{output.__name__} got both cache and past_key_values")
            kwargs["cache"] = kwargs.pop("past_key_values")
        generated(self, *args, **kwargs)

    type.__setattr__(output, "__init__", mark(__init__))  # past the metaclass, which would wrap it in its renaming
    output.past_key_values = property(lambda self: self.cache)  # over ModelOutput's, which logs
    return mark(output)


def with_cache_field(output):
    """A copy of a qwen-tts output dataclass whose ``past_key_values`` field is named ``cache``, in the same place,
    as 5.24 renamed it in transformers' own outputs; ``past_key_values`` stays an alias."""
    annotations = {("cache" if f.name == "past_key_values" else f.name): f.type for f in dataclasses.fields(output)}
    defaults = {("cache" if f.name == "past_key_values" else f.name): f.default for f in dataclasses.fields(output)
                if f.default is not dataclasses.MISSING}
    namespace = {"__module__": output.__module__, "__qualname__": output.__qualname__, "__doc__": output.__doc__,
                 "__annotations__": annotations, **defaults}
    return alias_past_key_values(dataclasses.dataclass(type(output)(output.__name__, output.__bases__, namespace)))


def _shim_output_cache() -> bool:
    from transformers.modeling_outputs import BaseModelOutputWithPast

    if "cache" not in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}:
        return False
    done = False
    for name in (_MODELS, _TOKENIZER_12HZ):
        module = sys.modules.get(name)
        for attr in ("Qwen3TTSTalkerOutputWithPast", "Qwen3TTSTalkerCodePredictorOutputWithPast",
                     "BaseModelOutputWithPast"):
            output = getattr(module, attr, None)
            if output is None or marked(output):
                continue
            if output is BaseModelOutputWithPast:  # transformers' own, already with `cache`: a subclass for qwen-tts
                namespace = {"__module__": name, "__qualname__": attr, "__doc__": output.__doc__}
                replacement = alias_past_key_values(dataclasses.dataclass(type(output)(attr, (output,), namespace)))
            else:
                replacement = with_cache_field(output)
            # qwen-tts looks these names up in its module globals each time it builds an output
            setattr(module, attr, replacement)
            done = True
    return done


def accept_cache_kwarg(forward):
    """Wrap a qwen-tts ``forward`` that takes ``past_key_values`` to take the ``cache=`` that 5.24's generate passes."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if "cache" in kwargs:
            if kwargs.get("past_key_values") is not None:
                raise TypeError(f"{type(self).__name__}.forward got both cache and past_key_values")
            kwargs["past_key_values"] = kwargs.pop("cache")
        return forward(self, *args, **kwargs)

    return mark(wrapper)


def _shim_forward_cache() -> bool:
    from transformers import GenerationMixin

    if "cache" not in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters:
        return False
    return _wrap_methods(_classes(_MODELS, *_GENERATORS), "forward", accept_cache_kwarg)


SHIMS = {
    "pad_token_id": _shim_pad_token_id,
    "rope_parameters": _shim_rope_parameters,
    "rope_default": _shim_rope_default,
    "tied_weights_keys": _shim_tied_weights_keys,
    "init_weights": _shim_init_weights,
    "mask_kwargs": _shim_mask_kwargs,
    "cache_position": _shim_cache_position,
    "mimi_properties": _shim_mimi_properties,
    "output_cache": _shim_output_cache,
    "forward_cache": _shim_forward_cache,
}
