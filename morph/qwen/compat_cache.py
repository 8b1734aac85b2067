"""The compat shims for transformers 5.24, which renamed ``past_key_values`` to ``cache`` in ``ModelOutput``, the
mask functions and ``generate``'s model inputs (the old name still works there, noting its deprecation). Applied
after ``import qwen_tts``, on its own classes and module globals, as morph/qwen/compat_qwen_tts.py's are (whose
mask_kwargs and cache_position shims take the new name too); morph/qwen/compat.py applies them:
  output_cache        5.24+  ``ModelOutput`` renamed its ``past_key_values`` field to ``cache`` and renames the
                             keyword before any subclass's ``__init__`` sees it; qwen-tts's two talker outputs
                             still declare ``past_key_values`` (TypeError at the first forward), and generate
                             carries the cache to the next step only from an output's ``cache`` key. The old name
                             still works as keyword and attribute, but logs a deprecation, and qwen-tts (and the
                             pack, reading its outputs) use only that one. qwen-tts's modules get copies of its two
                             outputs with a ``cache`` field, and a subclass of ``BaseModelOutputWithPast``; in all
                             three ``past_key_values`` is an alias that does not log.
  forward_cache       5.24+  ``generate`` passes the cache to the model as ``cache=``. The talker's and code
                             predictor's ``forward`` take ``past_key_values`` and hand an unknown ``cache`` on to
                             their layers unused, so every step started an empty cache. Silent: wrong codes.
"""

from __future__ import annotations

import functools
import inspect
import sys

from .compat_qwen_tts import _MODELS, _TOKENIZER_12HZ, _classes, _wrap_methods
from .marks import mark, marked


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
    from dataclasses import MISSING, dataclass, fields

    annotations = {("cache" if f.name == "past_key_values" else f.name): f.type for f in fields(output)}
    defaults = {("cache" if f.name == "past_key_values" else f.name): f.default for f in fields(output)
                if f.default is not MISSING}
    namespace = {"__module__": output.__module__, "__qualname__": output.__qualname__, "__doc__": output.__doc__,
                 "__annotations__": annotations, **defaults}
    return alias_past_key_values(dataclass(type(output)(output.__name__, output.__bases__, namespace)))


def _shim_output_cache() -> bool:
    from dataclasses import dataclass, fields

    from transformers.modeling_outputs import BaseModelOutputWithPast

    if "cache" not in {f.name for f in fields(BaseModelOutputWithPast)}:
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
                replacement = alias_past_key_values(dataclass(type(output)(attr, (output,), namespace)))
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
    targets = _classes(_MODELS, "Qwen3TTSTalkerForConditionalGeneration",
                       "Qwen3TTSTalkerCodePredictorModelForConditionalGeneration")
    return _wrap_methods(targets, "forward", accept_cache_kwarg)


SHIMS = {"output_cache": _shim_output_cache, "forward_cache": _shim_forward_cache}
