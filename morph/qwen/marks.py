"""Marks on what the compat shims and the model's patch create, and the check for another pack's wrapper (apart from
compat.py, so the shims and morph/reference/patch.py use them without a cycle)."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

_MARK = "_qwen_tts_compat"  # set on every object we create, so a second call sees it and does nothing


def marked(obj) -> bool:
    return getattr(obj, _MARK, False)


def mark(obj):
    setattr(obj, _MARK, True)
    return obj


# Where the original functions and their own decorators (transformers wraps some in torch.no_grad) live.
_HOMES = tuple(f"{os.sep}{package}{os.sep}" for package in ("qwen_tts", "transformers", "torch"))


def note_foreign_wrapper(obj, what: str) -> bool:
    """Log (and return True) when `obj`, about to be wrapped, is already another package's wrapper: a layer of its
    ``__wrapped__`` chain whose code was written outside qwen-tts, transformers and torch, and not ours."""
    layer = obj
    while layer is not None and not marked(layer):
        code = getattr(layer, "__code__", None) or getattr(getattr(layer, "__func__", None), "__code__", None)
        where = code.co_filename if code is not None else ""
        if where and not any(home in where for home in _HOMES):
            logger.warning("qwen-tts compat: %s was already replaced by another package (%s); wrapping that "
                           "version. If Qwen3-TTS misbehaves, try without the other Qwen3-TTS node packs", what,
                           where)
            return True
        layer = getattr(layer, "__wrapped__", None)
    return False
