"""The compat shims applied before ``import qwen_tts``, on transformers names (morph/qwen/compat.py applies them).

Only adding or widening, so other models are unaffected; check_model_inputs is given back to transformers as
soon as the import ends, so other packs never see it:
  check_model_inputs  5.2+   qwen-tts decorates with ``@check_model_inputs()`` at class definition. 5.2/5.3
                             removed the decorator; 5.4 restored it as ``check_model_inputs(func)``, an alias
                             of ``merge_with_config_defaults`` that must not be called bare ("missing 'func'").
                             We accept both call forms (restoring the same alias where it is missing).
  mimi_keys           5.21+  ``MimiModel`` was split into encoder/decoder halves with a new parameter layout.
                             transformers renames old checkpoints' keys for its own classes only, so the 12 Hz
                             tokenizer's Mimi encoder (a qwen-tts subclass) loaded random weights. We register
                             Mimi's renaming for that class name with ``register_checkpoint_conversion_mapping``.
"""

from __future__ import annotations

import functools
import inspect

from .marks import mark, marked


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


SHIMS = {"check_model_inputs": _shim_check_model_inputs, "mimi_keys": _shim_mimi_keys}
