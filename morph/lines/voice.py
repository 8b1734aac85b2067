"""A cloned voice and its safetensors file (never pickle). `check_voice` needs numpy alone, for the speech server's HTTP
process; `read_voice` makes a Voice in the engine's process."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .words import FOR_PYTHON, Words, model_size_name

if TYPE_CHECKING:
    import torch

FORMAT = "qwen3-tts-morph-voice"
VERSION = "1"
NUM_CODE_GROUPS = 16
CODEBOOK_SIZE = 2048


@dataclass(frozen=True)
class Voice:
    spk_embedding: torch.Tensor  # float32 [hidden], on CPU
    ref_code: torch.Tensor | None  # int64 [T, 16], on CPU; None in x-vector-only mode
    ref_text: str | None
    model_size: str  # "0b6" or "1b7": the checkpoint family the embedding came from

    @property
    def icl(self) -> bool:
        return self.ref_code is not None

    @property
    def hidden_size(self) -> int:
        return int(self.spk_embedding.shape[0])


def voice_bytes(voice: Voice) -> bytes:
    """The voice file's bytes (what save_voice writes)."""
    from safetensors.torch import save

    tensors = {"spk_embedding": voice.spk_embedding.detach().float().cpu().contiguous()}
    if voice.ref_code is not None:
        tensors["ref_code"] = voice.ref_code.detach().long().cpu().contiguous()
    metadata = {"format": FORMAT, "version": VERSION, "mode": "icl" if voice.icl else "xvector",
                "ref_text": json.dumps(voice.ref_text), "hidden_size": str(voice.hidden_size),
                "model_size": voice.model_size}
    return save(tensors, metadata=metadata)


def save_voice(voice: Voice, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(voice_bytes(voice))
    return path


def load_voice(path: str | Path, who: str = "load_voice", words: Words = FOR_PYTHON) -> Voice:
    """Read and check a voice file; anything unexpected is rejected before use (the fix worded as `words` does)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{who}: no voice file at {path}")
    return read_voice(path.read_bytes(), who, path.name, words)


def read_voice(data: bytes, who: str, name: str, words: Words = FOR_PYTHON) -> Voice:
    """The Voice of a file's bytes, checked as check_voice does (`name`: the file's, for messages)."""
    import torch

    spk, code, ref_text, model_size = check_voice(data, who, name, words)
    return Voice(torch.from_numpy(spk), None if code is None else torch.from_numpy(code), ref_text, model_size)


def check_voice(data: bytes, who: str, name: str, words: Words = FOR_PYTHON
                ) -> tuple[np.ndarray, np.ndarray | None, str | None, str]:
    """A voice file's spk_embedding, ref_code, ref_text and model_size from its bytes; ValueError says what is wrong."""
    from safetensors.numpy import load

    try:
        tensors = load(data)
        metadata = json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).get("__metadata__") or {}
    except Exception as e:  # safetensors raises its own error types for non-safetensors data
        raise ValueError(f"{who}: {name} is not a valid safetensors voice file ({e}); "
                         f"{words.make_voice}") from e
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{who}: {name} is a safetensors file but not a Qwen3-TTS voice "
                         f"(format {metadata.get('format')!r}); {words.make_voice}")
    if metadata.get("version") != VERSION:
        raise ValueError(f"{who}: {name} has voice format version {metadata.get('version')!r}; "
                         f"this pack reads version {VERSION}")
    spk = tensors.get("spk_embedding")
    if spk is None or spk.ndim != 1 or spk.dtype != np.float32 or not np.isfinite(spk).all():
        raise ValueError(f"{who}: {name} has no valid spk_embedding (float32 [hidden] expected)")
    if str(spk.shape[0]) != metadata.get("hidden_size"):
        raise ValueError(f"{who}: {name}'s embedding has {spk.shape[0]} values but its metadata says "
                         f"{metadata.get('hidden_size')}")
    code = tensors.get("ref_code")
    mode = metadata.get("mode")
    if mode not in ("icl", "xvector") or (mode == "icl") != (code is not None):
        raise ValueError(f"{who}: {name} has mode {mode!r} but {'a' if code is not None else 'no'} ref_code")
    if code is not None and (code.dtype != np.int64 or code.ndim != 2 or code.shape[1] != NUM_CODE_GROUPS
                             or code.shape[0] == 0 or code.min() < 0 or code.max() >= CODEBOOK_SIZE):
        raise ValueError(f"{who}: {name} has a malformed ref_code (int64 [T, {NUM_CODE_GROUPS}] "
                         f"with values below {CODEBOOK_SIZE} expected)")
    try:
        ref_text = json.loads(metadata.get("ref_text", "null"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{who}: {name} has unreadable ref_text metadata") from e
    if mode == "icl" and not ref_text:
        raise ValueError(f"{who}: {name} is an ICL voice without its transcript")
    return spk, code, ref_text, metadata.get("model_size", "")


def check_voice_fits(voice: Voice, hidden_size: int, model_size: str, who: str,
                     words: Words = FOR_PYTHON) -> None:
    """A voice is tied to the model family whose speaker encoder made it."""
    if voice.hidden_size != hidden_size:
        raise ValueError(
            f"{who}: this voice was made with a {model_size_name(voice.model_size)} model "
            f"(embedding size {voice.hidden_size}) but the loaded model is {model_size_name(model_size)} (size "
            f"{hidden_size}); make the voice again on this model: {words.make_voice}")
