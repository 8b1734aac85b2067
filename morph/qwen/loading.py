"""Load a Qwen3-TTS checkpoint folder (found by morph/qwen/checkpoints.py) on a device, in a dtype."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import torch

from .compat import import_qwen_tts
from .quiet import no_loading_bars, quiet_third_party

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_device(device: str = "auto") -> torch.device:
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} is not available: this PyTorch sees no CUDA GPU; choose auto or cpu")
    if kind == "mps" and not mps:
        raise ValueError(f"device {device!r} is not available: MPS needs an Apple-silicon Mac with a PyTorch built "
                         "for it; choose auto or cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32  # half precision on CPU is slow and lossy
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except Exception:  # a broken flash-attn build raises more than ImportError
        return False
    return True


def resolve_attention(attention: str, device: torch.device, dtype: torch.dtype) -> str:
    if attention == "auto":
        fa = device.type == "cuda" and dtype != torch.float32 and flash_attn_available()
        attention = "flash_attention_2" if fa else "sdpa"
    elif attention == "flash_attention_2" and not flash_attn_available():
        raise RuntimeError("attention 'flash_attention_2' needs the flash-attn package, which does not import "
                           "here; choose auto or sdpa (same output, no extra install)")
    elif attention not in ("sdpa", "eager", "flash_attention_2"):
        raise ValueError(f"attention must be auto, sdpa, flash_attention_2 or eager; got {attention!r}")
    return attention


def resolve_load(device: str, dtype: str, attention: str) -> tuple[torch.device, torch.dtype, str]:
    """The device, dtype and attention a load gets here: what MorphTTS.load and a job's fingerprints use."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    return dev, dt, resolve_attention(attention, dev, dt)


def checkpoint_config(folder: Path) -> dict:
    """A checkpoint folder's config.json: what the model is, known without loading its weights."""
    try:
        return json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RuntimeError(f"reading {Path(folder) / 'config.json'} failed ({e}); the checkpoint may be incomplete or "
                           "corrupt: download it again") from e


def load_qwen_tts(folder: Path, device: torch.device, dtype: torch.dtype, attention: str, progress_bars: bool = False):
    """Load a checkpoint folder with qwen-tts, its failures as clear messages."""
    qwen_tts = import_qwen_tts()
    log.info("Qwen3-TTS attention: %s", attention)  # said here, once a load: resolve_load also runs without one
    try:
        with quiet_third_party(), contextlib.nullcontext() if progress_bars else no_loading_bars():
            tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(folder), dtype=dtype, attn_implementation=attention)
    except Exception as e:
        raise RuntimeError(f"loading the Qwen3-TTS checkpoint in {folder} failed ({type(e).__name__}: {e}); "
                           "the files may be incomplete or corrupt, or not a Qwen3-TTS-12Hz checkpoint: "
                           "download it again") from e
    place(tts, device)
    if tts.model.tokenizer_type != "qwen3_tts_tokenizer_12hz":
        raise ValueError(f"{folder} is a {tts.model.tokenizer_type} model; this pack runs the 12 Hz models only")
    return tts


def place(tts, device: torch.device) -> None:
    """Move a loaded model to a device: the speech tokenizer is a plain attribute, which `model.to()` would leave,
    and so are the talker's `rope_deltas` and Mimi's cached codebook embeddings, dropped here to be rebuilt."""
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    tts.model.to(device)
    tts.model.talker.rope_deltas = None
    codec = tts.model.speech_tokenizer
    codec.model.to(device)
    for module in codec.model.modules():
        if isinstance(module, MimiEuclideanCodebook):
            module._embed = None
    codec.device = torch.device(device)
    tts.device = torch.device(device)
