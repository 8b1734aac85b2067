"""Run qwen-tts 0.1.1 (written against transformers 4.57.3) on transformers 5.x, without editing site-packages.

Use ``import_qwen_tts()`` instead of ``import qwen_tts``. Each shim is feature-detected and applied only when
the installed transformers needs it: none on 4.57.x. Before the import, on transformers names
(morph/compat_transformers.py); after it, on qwen-tts's own classes and module globals
(morph/compat_qwen_tts.py); each module's docstring says which release needs which shim and why. Checked on
every release from 5.0.0 to 5.23.0: with these shims, a tiny random model gives the same codes as on 4.57.3
(greedy and seeded sampling, sdpa and eager, batched with left padding, ICL prompts, after
save_pretrained/from_pretrained), and the same 12 Hz decode.

Not shimmed, on purpose: from 5.3 transformers' Mimi honours ``sliding_window`` (250 frames = 10 s for the 12 Hz
tokenizer) under sdpa/eager, as 4.57 did only under flash-attention-2. So encoding reference audio longer than
10 s gives different codes than 4.57.3 with sdpa; shorter references encode identically.

Deleting the compat modules: once a qwen-tts release supports transformers 5 (dict ``_tied_weights_keys``,
guarded ``_init_weights`` that fills ``inv_freq``, no ``cache_position`` dependence, the 5.x mask and Mimi APIs),
require it, replace ``import_qwen_tts()`` with ``import qwen_tts``, and delete them and their tests. Until then,
run tests/morph/test_compat*.py under any new transformers release before allowing it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys

from .quiet import quiet_third_party

logger = logging.getLogger(__name__)

# What `import qwen_tts` needs (pip names = import names). sox, onnxruntime, einops and torchaudio are only
# imported because qwen_tts/__init__ imports the 25 Hz tokenizer; 12 Hz models never call them.
_IMPORT_DEPS = ("torch", "torchaudio", "transformers", "huggingface_hub", "numpy", "librosa", "soundfile", "sox",
                "onnxruntime", "einops")

_applied: list[str] = []
_MARK = "_qwen_tts_compat"  # set on every object we create, so a second call sees it and does nothing


def marked(obj) -> bool:
    return getattr(obj, _MARK, False)


def mark(obj):
    setattr(obj, _MARK, True)
    return obj


# Where the original functions and their own decorators (transformers wraps some in torch.no_grad) live.
_HOMES = tuple(f"{os.sep}{package}{os.sep}" for package in ("qwen_tts", "transformers", "torch"))


def note_foreign_wrapper(obj, what: str) -> bool:
    """Log (and return True) when `obj`, about to be wrapped, is already another package's wrapper.

    A function's code records the file it was written in, even when ``functools.wraps`` copied the
    original's name and module onto it: a layer (of the ``__wrapped__`` chain) written outside qwen-tts,
    transformers and torch, and not ours, is another pack's patch. Wrapping it again usually works; when
    two patches disagree, this line is the clue.
    """
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


def import_qwen_tts():
    """Apply the compat shims, import qwen_tts, patch its classes, and return the module.

    Raises ImportError naming the packages to install if qwen_tts or an import-time dependency is missing.
    """
    from . import compat_qwen_tts, compat_transformers  # imported here: they build on this module's mark()

    # Before the first import: check_model_inputs is used as a decorator while qwen-tts's classes are defined.
    new = [] if "qwen_tts" in sys.modules else _apply(compat_transformers.SHIMS)
    try:
        if importlib.util.find_spec("qwen_tts") is None:
            raise ModuleNotFoundError("No module named 'qwen_tts'", name="qwen_tts")
        with quiet_third_party():
            qwen_tts = importlib.import_module("qwen_tts")
    except ImportError as exc:
        missing = [name for name in _IMPORT_DEPS if importlib.util.find_spec(name) is None]
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
        compat_transformers.restore_check_model_inputs()
    _log(new + _apply(compat_qwen_tts.SHIMS))
    return qwen_tts
