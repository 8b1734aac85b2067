"""Run qwen-tts 0.1.1 (written against transformers 4.57.3) on transformers 5.x, without editing site-packages.

Use ``import_qwen_tts()`` instead of ``import qwen_tts``. Each shim is feature-detected and applied only when
the installed transformers needs it: none on 4.57.x. Checked on every release from 5.0.0 to 5.23.0: with these
shims, a tiny random model gives the same codes as on 4.57.3 (greedy and seeded sampling, sdpa and eager,
batched with left padding, ICL prompts, after save_pretrained/from_pretrained), and the same 12 Hz decode.

Before ``import qwen_tts``, on transformers names (only adding or widening, so other models are unaffected;
check_model_inputs is given back to transformers as soon as the import ends, so other packs never see it):
  check_model_inputs  5.2+   qwen-tts decorates with ``@check_model_inputs()`` at class definition. 5.2/5.3
                             removed the decorator; 5.4 restored it as ``check_model_inputs(func)``, an alias
                             of ``merge_with_config_defaults`` that must not be called bare ("missing 'func'").
                             We accept both call forms (restoring the same alias where it is missing).
  mimi_keys           5.21+  ``MimiModel`` was split into encoder/decoder halves with a new parameter layout.
                             transformers renames old checkpoints' keys for its own classes only, so the 12 Hz
                             tokenizer's Mimi encoder (a qwen-tts subclass) loaded random weights. We register
                             Mimi's renaming for that class name with ``register_checkpoint_conversion_mapping``.

After ``import qwen_tts``, on qwen-tts's own classes and module globals (nothing else in the process sees them):
  pad_token_id        5.0+   ``PreTrainedConfig`` no longer defines ``pad_token_id``; the talker and code
                             predictor read it (None) when built.
  rope_parameters     5.0+   5.x saves ``rope_scaling`` as ``rope_parameters``. Reloading such a config.json,
                             qwen-tts's config ``__init__`` overwrote it with its own ``rope_scaling=None`` (the
                             talker lost mrope_section) or failed 5.x's rope validation. Configs written by 4.57
                             (all released checkpoints) were fine; 5.x-saved ones now load the same way.
  rope_default        5.0+   ``ROPE_INIT_FUNCTIONS["default"]`` was removed; qwen-tts looks it up for every
                             rotary embedding. Its modules get a view of the table that adds 4.57's function.
  tied_weights_keys   5.0+   ``_tied_weights_keys`` must be a dict; qwen-tts's lists crash ``save_pretrained``.
                             They never tied anything (tie_word_embeddings is False), so they become None.
  init_weights        5.0+   ``from_pretrained`` builds on the meta device, loads, then runs ``_init_weights``
                             on what it thinks is missing. Nothing refilled qwen-tts's non-persistent RoPE
                             ``inv_freq`` buffers (left as uninitialised memory), and before 5.13 qwen-tts's
                             unguarded ``.data.normal_()`` also re-randomised the loaded weights. Silent: no
                             error, wrong audio.
  mask_kwargs         5.9+   ``create_causal_mask`` renamed ``input_embeds`` to ``inputs_embeds`` (alias until
                             5.8) and dropped ``cache_position``.
  cache_position      5.4+   ``generate`` stopped passing ``cache_position`` to the model; the talker builds its
                             multimodal RoPE positions from it (shape errors, or wrong positions with padding).
  mimi_properties     5.21+  ``MimiModel.upsample``/``decoder_transformer`` became read-only properties; the
                             qwen-tts encoder subclass sets them to None to drop Mimi's decoder half.

Not shimmed, on purpose: from 5.3 transformers' Mimi honours ``sliding_window`` (250 frames = 10 s for the 12 Hz
tokenizer) under sdpa/eager, as 4.57 did only under flash-attention-2. So encoding reference audio longer than
10 s gives different codes than 4.57.3 with sdpa; shorter references encode identically.

Deleting this file: once a qwen-tts release supports transformers 5 (dict ``_tied_weights_keys``, guarded
``_init_weights`` that fills ``inv_freq``, no ``cache_position`` dependence, the 5.x mask and Mimi APIs), require
it, replace ``import_qwen_tts()`` with ``import qwen_tts``, and delete this module and tests/morph/test_compat.py.
Until then, run that test under any new transformers release before allowing it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import os
import sys

from .quiet import quiet_third_party

logger = logging.getLogger(__name__)

_MODELS = "qwen_tts.core.models.modeling_qwen3_tts"
_CONFIGS = "qwen_tts.core.models.configuration_qwen3_tts"
_TOKENIZER_12HZ = "qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2"
_TOKENIZER_12HZ_CONFIG = "qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2"
_TOKENIZER_25HZ = "qwen_tts.core.tokenizer_25hz.modeling_qwen3_tts_tokenizer_v1"

# Packages that `import qwen_tts` needs (import name -> pip name). sox, onnxruntime, einops and torchaudio are
# only imported because qwen_tts/__init__ imports the 25 Hz tokenizer; 12 Hz models never call them.
_IMPORT_DEPS = {
    "torch": "torch",
    "torchaudio": "torchaudio",
    "transformers": "transformers",
    "huggingface_hub": "huggingface_hub",
    "numpy": "numpy",
    "librosa": "librosa",
    "soundfile": "soundfile",
    "sox": "sox",
    "onnxruntime": "onnxruntime",
    "einops": "einops",
}

_applied: list[str] = []
_MARK = "_qwen_tts_compat"  # set on every object we create, so a second call sees it and does nothing


def _marked(obj) -> bool:
    return getattr(obj, _MARK, False)


def _mark(obj):
    setattr(obj, _MARK, True)
    return obj


# Where the original functions and their own decorators (transformers wraps some in torch.no_grad) live.
_HOMES = tuple(f"{os.sep}{package}{os.sep}" for package in ("qwen_tts", "transformers", "torch"))


def _code_file(obj) -> str:
    code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__func__", None), "__code__", None)
    return code.co_filename if code is not None else ""


def note_foreign_wrapper(obj, what: str) -> bool:
    """Log (and return True) when `obj`, about to be wrapped, is already another package's wrapper.

    A function's code records the file it was written in, even when ``functools.wraps`` copied the
    original's name and module onto it: a layer (of the ``__wrapped__`` chain) written outside qwen-tts,
    transformers and torch, and not ours, is another pack's patch. Wrapping it again usually works; when
    two patches disagree, this line is the clue.
    """
    layer = obj
    while layer is not None and not _marked(layer):
        where = _code_file(layer)
        if where and not any(home in where for home in _HOMES):
            logger.warning("qwen-tts compat: %s was already replaced by another package (%s); wrapping that "
                           "version. If Qwen3-TTS misbehaves, try without the other Qwen3-TTS node packs", what,
                           where)
            return True
        layer = getattr(layer, "__wrapped__", None)
    return False


# ---------------------------------------------------------------- before import: transformers names


def accepts_both_call_forms(decorator):
    """Wrap a decorator that requires ``func`` so that ``@decorator()`` (kwargs ignored) also works."""

    @functools.wraps(decorator)
    def wrapper(func=None, **_ignored):
        # @decorator()  -> called with no function: hand back the bare decorator
        return decorator if func is None else decorator(func)

    return _mark(wrapper)


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
    elif _marked(current) or not _needs_func_argument(current):
        return False
    _rebound.append(generic.__dict__.get("check_model_inputs", _MISSING))
    generic.check_model_inputs = accepts_both_call_forms(current)
    return True


def _restore_check_model_inputs() -> None:
    """Give transformers its own check_model_inputs back once qwen-tts's classes are defined.

    qwen-tts reads the name only at import (`from transformers.utils.generic import check_model_inputs`, used
    as a class-definition decorator), so its modules keep the wrapper; other packs see transformers unchanged.
    """
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


# ---------------------------------------------------------------- after import: qwen-tts classes


def _loaded(name):
    """A qwen_tts module if it has been imported; post-import shims skip until then."""
    return sys.modules.get(name)


def _shim_pad_token_id() -> bool:
    from transformers import PretrainedConfig

    configs = _loaded(_CONFIGS)
    if configs is None or hasattr(PretrainedConfig(), "pad_token_id"):
        return False
    done = False
    for cls in (configs.Qwen3TTSTalkerConfig, configs.Qwen3TTSTalkerCodePredictorConfig):
        if "pad_token_id" not in cls.__dict__:
            cls.pad_token_id = None  # 4.57's default; a value in config.json still wins (instance attribute)
            done = True
    return done


def accept_saved_rope_parameters(init):
    """Wrap a qwen-tts config ``__init__`` so a config.json written by 5.x loads like one written by 4.57.

    5.x saves ``rope_scaling`` as ``rope_parameters``. qwen-tts's ``__init__`` then passed that on to 5.x's
    validation (which on some releases demands a ``rope_theta`` inside it) and afterwards assigned its own
    ``rope_scaling=None`` default over it, losing the talker's mrope_section.
    """
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

    return _mark(__init__)


def _shim_rope_parameters() -> bool:
    from transformers import PretrainedConfig

    if not isinstance(inspect.getattr_static(PretrainedConfig, "rope_scaling", None), property):  # 4.x
        return False
    targets = []
    if (configs := _loaded(_CONFIGS)) is not None:
        targets += [configs.Qwen3TTSTalkerConfig, configs.Qwen3TTSTalkerCodePredictorConfig]
    if (tokenizer := _loaded(_TOKENIZER_12HZ_CONFIG)) is not None:
        targets += [tokenizer.Qwen3TTSTokenizerV2DecoderConfig]
    done = False
    for cls in targets:
        if not _marked(cls.__init__):
            note_foreign_wrapper(cls.__init__, f"{cls.__name__}.__init__")
            cls.__init__ = accept_saved_rope_parameters(cls.__init__)
            done = True
    return done


def compute_default_rope_parameters(config, device=None, seq_len=None, **_):
    """transformers 4.57.3's ``_compute_default_rope_parameters`` (plain RoPE), removed in 5.0."""
    import torch

    base = config.rope_theta
    partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * partial_rotary_factor)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


def _shim_rope_default() -> bool:
    import collections

    done = False
    for name in (_MODELS, _TOKENIZER_12HZ):
        module = _loaded(name)
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
    for name in (_MODELS, _TOKENIZER_12HZ, _TOKENIZER_25HZ):
        module = _loaded(name)
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

    return _mark(_init_weights)


def _shim_init_weights() -> bool:
    if importlib.util.find_spec("transformers.initialization") is None:  # 4.x: initialise, then load
        return False
    targets = []
    if (models := _loaded(_MODELS)) is not None:
        targets += [models.Qwen3TTSPreTrainedModel, models.Qwen3TTSTalkerTextPreTrainedModel]
    if (tokenizer := _loaded(_TOKENIZER_12HZ)) is not None:
        targets += [tokenizer.Qwen3TTSTokenizerV2DecoderPreTrainedModel]
    done = False
    for cls in targets:
        if not _marked(cls._init_weights):
            note_foreign_wrapper(cls._init_weights, f"{cls.__name__}._init_weights")
            cls._init_weights = guard_init_weights(cls._init_weights)
            done = True
    return done


def accept_legacy_mask_kwargs(create_mask):
    """Let a 5.x ``create_*_mask`` take 4.57's ``input_embeds=`` and ``cache_position=``."""
    params = inspect.signature(create_mask).parameters

    @functools.wraps(create_mask)
    def wrapper(*args, **kwargs):
        if "input_embeds" in kwargs and "input_embeds" not in params:
            kwargs["inputs_embeds"] = kwargs.pop("input_embeds")
        if "cache_position" not in params:
            # 5.x derives it from past_key_values; qwen-tts's is always arange(past_len, past_len + q_len)
            kwargs.pop("cache_position", None)
        return create_mask(*args, **kwargs)

    return _mark(wrapper)


def _shim_mask_kwargs() -> bool:
    done = False
    for name in (_MODELS, _TOKENIZER_12HZ):
        module = _loaded(name)
        for attr in ("create_causal_mask", "create_sliding_window_causal_mask"):
            fn = getattr(module, attr, None)
            if fn is None or _marked(fn):
                continue
            params = inspect.signature(fn).parameters
            if "input_embeds" in params and "cache_position" in params:
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
            past = inputs.get("past_key_values")
            seen = past.get_seq_length() if past is not None else 0
            new = inputs["inputs_embeds"] if inputs.get("inputs_embeds") is not None else inputs["input_ids"]
            inputs["cache_position"] = torch.arange(seen, seen + new.shape[1], device=new.device)
        return inputs

    return _mark(wrapper)


def _shim_cache_position() -> bool:
    from transformers import GenerationMixin

    models = _loaded(_MODELS)
    if models is None or "cache_position" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters:
        return False
    done = False
    # The talker keys its multimodal-RoPE positions on cache_position (None makes it rebuild them for the
    # whole sequence every step: shape errors, or wrong positions with left padding).
    for cls in (models.Qwen3TTSTalkerForConditionalGeneration, models.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration):
        if not _marked(cls.prepare_inputs_for_generation):
            note_foreign_wrapper(cls.prepare_inputs_for_generation, f"{cls.__name__}.prepare_inputs_for_generation")
            cls.prepare_inputs_for_generation = pass_cache_position(cls.prepare_inputs_for_generation)
            done = True
    return done


def _shim_mimi_properties() -> bool:
    tokenizer = _loaded(_TOKENIZER_12HZ)
    if tokenizer is None:
        return False
    encoder = tokenizer.Qwen3TTSTokenizerV2Encoder
    done = False
    for attr in ("upsample", "decoder_transformer"):
        inherited = inspect.getattr_static(encoder, attr, None)
        if isinstance(inherited, property) and inherited.fset is None:
            # The encoder sets these to None to drop Mimi's decoder half; 5.x derives them from
            # self.decoder, which it also sets to None. Reads give None, as on 4.57.
            setattr(encoder, attr, property(lambda self: None, lambda self, value: None))
            done = True
    return done


_BEFORE_IMPORT = {
    "check_model_inputs": _shim_check_model_inputs,
    "mimi_keys": _shim_mimi_keys,
}
_AFTER_IMPORT = {
    "pad_token_id": _shim_pad_token_id,
    "rope_parameters": _shim_rope_parameters,
    "rope_default": _shim_rope_default,
    "tied_weights_keys": _shim_tied_weights_keys,
    "init_weights": _shim_init_weights,
    "mask_kwargs": _shim_mask_kwargs,
    "cache_position": _shim_cache_position,
    "mimi_properties": _shim_mimi_properties,
}


def _apply(shims: dict) -> list[str]:
    new = [name for name, shim in shims.items() if shim()]
    _applied.extend(n for n in new if n not in _applied)
    return new


_logged = False


def _log(new: list[str]) -> None:
    """One line the first time, then only when something new was applied."""
    global _logged
    if _logged and not new:
        return
    _logged = True
    import transformers

    applied = ", ".join(_applied) or "none needed"
    logger.info("qwen-tts compat shims for transformers %s: %s", transformers.__version__, applied)


def applied_shims() -> list[str]:
    return list(_applied)


def _missing_import_deps() -> list[str]:
    return [pip for mod, pip in _IMPORT_DEPS.items() if importlib.util.find_spec(mod) is None]


def import_qwen_tts():
    """Apply the compat shims, import qwen_tts, patch its classes, and return the module.

    Raises ImportError naming the packages to install if qwen_tts or an import-time dependency is missing.
    """
    # Before the first import: check_model_inputs is used as a decorator while qwen-tts's classes are defined.
    new = [] if "qwen_tts" in sys.modules else _apply(_BEFORE_IMPORT)
    try:
        if importlib.util.find_spec("qwen_tts") is None:
            raise ModuleNotFoundError("No module named 'qwen_tts'", name="qwen_tts")
        with quiet_third_party():
            qwen_tts = importlib.import_module("qwen_tts")
    except ImportError as exc:
        missing = _missing_import_deps()
        if importlib.util.find_spec("qwen_tts") is None:
            missing.insert(0, "qwen-tts==0.1.1 (with --no-deps, so it keeps your transformers)")
        hint = f"missing: {', '.join(missing)}. " if missing else ""
        pip = f"{sys.executable} -m pip install"
        others = [p for p in missing if not p.startswith("qwen-tts") and p not in ("torch", "torchaudio")]
        raise ImportError(
            f"Could not import qwen_tts ({exc}). {hint}Fix, with the Python that runs ComfyUI: "
            f"{pip} --no-deps qwen-tts==0.1.1" + (f" && {pip} {' '.join(others)}" if others else "")
            + " (--no-deps keeps your torch, torchaudio and transformers: 4.57.x and 5.x both work; the pack's "
            "requirements.txt lists what qwen-tts needs besides)."
        ) from exc
    finally:
        _restore_check_model_inputs()
    _log(new + _apply(_AFTER_IMPORT))
    return qwen_tts
