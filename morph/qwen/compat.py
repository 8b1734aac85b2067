"""Run qwen-tts 0.1.1 (written for transformers 4.57.3) on transformers 5.x without editing site-packages: call
``import_qwen_tts()``, never ``import qwen_tts``. Each shim (compat_qwen_tts.py) is feature-detected and applied only
where the installed transformers needs it (none on 4.57.x); test a new release with tests/morph/qwen/test_compat*.py
before allowing it, and delete the shims once qwen-tts supports 5.x. Not shimmed, on purpose: from 5.3 Mimi honours
``sliding_window`` under sdpa, as 4.57 did only under flash-attention-2, so audio over 10 s encodes differently."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
import types
from importlib import metadata
from pathlib import Path

from .quiet import quiet_third_party

logger = logging.getLogger(__name__)

# What `import qwen_tts` needs (pip names = import names): sox, onnxruntime and einops only because qwen_tts/__init__
# imports the 25 Hz tokenizer, which 12 Hz models never call; torchaudio too, for which _without_torchaudio() stands in.
_IMPORT_DEPS = ("transformers", "huggingface_hub", "numpy", "librosa", "soundfile", "sox", "onnxruntime", "einops")
_KALDI = "torchaudio.compliance.kaldi"  # the one torchaudio module qwen-tts imports (25 Hz tokenizer)

QWEN_TTS_VERSION = "0.1.1"  # the release the pack is tested on (its exact mode reproduces it bit for bit)
_INSTALL = f"-m pip install --no-deps qwen-tts=={QWEN_TTS_VERSION}"

_applied: list[str] = []
_logged = False


def _apply(shims: dict) -> list[str]:
    new = [name for name, shim in shims.items() if shim()]
    _applied.extend(n for n in new if n not in _applied)
    return new


def _log(new: list[str]) -> None:
    global _logged
    if _logged and not new:
        return
    _logged = True
    import transformers

    applied = ", ".join(_applied) or "none needed"
    logger.info("qwen-tts compat shims for transformers %s: %s", transformers.__version__, applied)


@contextlib.contextmanager
def _without_torchaudio():
    """While qwen_tts is imported: stand-ins for torchaudio.compliance.kaldi when the real one does not import. Only
    the 25 Hz tokenizer (which then raises) keeps them; other packs never see a fake torchaudio in sys.modules."""
    if "qwen_tts" in sys.modules:  # imported already: nothing will import torchaudio
        yield
        return
    before = {name for name in sys.modules if name.partition(".")[0] == "torchaudio"}
    try:
        importlib.import_module(_KALDI)
    except Exception as exc:  # a torchaudio for another torch or CUDA raises OSError or RuntimeError too
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
    else:
        yield
        return
    for name in [n for n in sys.modules if n.partition(".")[0] == "torchaudio" and n not in before]:
        del sys.modules[name]  # what a failed import left half done
    logger.info("qwen-tts: torchaudio is unavailable (%s), so its 25 Hz tokenizer is off; 12 Hz models never "
                "use it", reason)

    def unavailable(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(f"torchaudio is unavailable ({reason}), so qwen-tts's 25 Hz tokenizer cannot run; this "
                          "pack runs 12 Hz models only")

    names = ("torchaudio", "torchaudio.compliance", _KALDI)
    # a torchaudio that imports but whose kaldi fails keeps its own modules; the import finds our kaldi in sys.modules
    stand_ins = {name: types.ModuleType(name) for name in names if name not in sys.modules}
    for name, module in stand_ins.items():
        module.__path__ = []  # a package, so that its submodule's import is found in sys.modules
        parent, _, child = name.rpartition(".")
        if parent in stand_ins:
            setattr(stand_ins[parent], child, module)
    stand_ins[_KALDI].__getattr__ = unavailable
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def _import_advice(exc: ImportError) -> str:
    """What to install: qwen-tts when it is missing, and the packages its import needs that are missing."""
    pip = f"{sys.executable} -m pip install"
    missing = [name for name in _IMPORT_DEPS if importlib.util.find_spec(name) is None]
    steps = [f"{pip} {' '.join(missing)}"] if missing else []
    if importlib.util.find_spec("qwen_tts") is None:
        missing.insert(0, f"qwen-tts=={QWEN_TTS_VERSION} (with --no-deps, so it keeps your transformers)")
        steps.insert(0, f"{sys.executable} {_INSTALL}")
    if not steps:
        return (f"Could not import qwen_tts ({exc}): qwen-tts and the packages it imports are installed, but one "
                "of them failed to import; reinstall the one the message names (the pack's requirements.txt "
                "lists what qwen-tts needs)")
    return (f"Could not import qwen_tts ({exc}). missing: {', '.join(missing)}. Fix, with the Python that runs "
            f"ComfyUI: {' && '.join(steps)} (--no-deps keeps your torch and transformers: 4.57.x and 5.x both "
            "work; the pack's requirements.txt lists what qwen-tts needs besides).")


def _check_origin(qwen_tts) -> None:
    """Refuse any qwen_tts but the installed qwen-tts 0.1.1: another pack (ComfyUI-Qwen-TTS) may have imported its
    own modified copy first, and the pack's exactness and shims hold for 0.1.1 alone. Raises ImportError."""
    got = Path(getattr(qwen_tts, "__file__", None) or "?").resolve().parent
    try:
        dist = metadata.distribution("qwen-tts")
    except metadata.PackageNotFoundError:
        dist = None
    installed = Path(dist.locate_file("qwen_tts")).resolve() if dist else None
    if installed != got:
        where = f"qwen-tts {dist.version} is installed in {installed.parent}" if dist else "qwen-tts is not installed"
        raise ImportError(
            f"qwen_tts was imported from {got}, not from the installed qwen-tts ({where}): another custom node pack "
            "(ComfyUI-Qwen-TTS bundles its own modified qwen_tts and puts its folder first) loaded its copy, and this "
            f"pack runs only on qwen-tts {QWEN_TTS_VERSION}, which cannot be loaded beside it in one process. Fix: "
            f"disable the pack that holds {got.parent} (ComfyUI-Manager, or move it out of custom_nodes) and restart "
            f"ComfyUI" + ("" if dist else f", after {sys.executable} {_INSTALL}"))
    if dist.version != QWEN_TTS_VERSION:
        raise ImportError(f"qwen-tts {dist.version} is installed ({installed}); this pack is tested on "
                          f"{QWEN_TTS_VERSION} only. Fix, with the Python that runs ComfyUI: {sys.executable} {_INSTALL}")


def import_qwen_tts():
    """qwen_tts, compat-shimmed; an ImportError names the fix: what to install, or the pack whose copy was imported."""
    from . import compat_qwen_tts  # imported here: its shims load transformers

    # Before the first import: check_model_inputs is used as a decorator while qwen-tts's classes are defined.
    new = [] if "qwen_tts" in sys.modules else _apply(compat_qwen_tts.BEFORE_IMPORT)
    try:
        if importlib.util.find_spec("qwen_tts") is None:
            raise ModuleNotFoundError("No module named 'qwen_tts'", name="qwen_tts")
        with quiet_third_party(), _without_torchaudio():
            qwen_tts = importlib.import_module("qwen_tts")
    except ImportError as exc:
        raise ImportError(_import_advice(exc)) from exc
    finally:
        compat_qwen_tts.restore_check_model_inputs()
    _check_origin(qwen_tts)
    _log(new + _apply(compat_qwen_tts.SHIMS))
    return qwen_tts
