"""One model's load resolved on this machine (MorphTTS.load), also what a script job's fingerprints say of the model,
with or without loading it. A Ray worker or the engine process resolves the options where it loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .decode.runner import check_mode
from .qwen.loading import checkpoint_config, resolve_load


@dataclass(frozen=True)
class ModelConfig:
    source: str  # as the user named it: a hub id or a folder
    folder: Path  # the checkpoint folder it was found in
    variant: str  # config.json's tts_model_type: base, custom_voice or voice_design
    model_size: str  # config.json's tts_model_size: 0b6 or 1b7
    device: torch.device  # where it runs (a host's memory manager may keep it elsewhere between runs)
    dtype: torch.dtype
    attention: str  # the talker's attention kernel in upstream's layers
    mode: str  # the decode mode asked for, a retired one mapped (runner.resolve: what it runs as on a device)

    @classmethod
    def resolve(cls, source: str, folder: Path, device: str = "auto", dtype: str = "auto", attention: str = "auto",
                mode: str = "auto") -> "ModelConfig":
        """The record of loading the checkpoint in `folder` with these options here; ValueError naming a bad one."""
        checkpoint = checkpoint_config(folder)
        dev, dt, attn = resolve_load(device, dtype, attention)
        return cls(str(source), Path(folder), str(checkpoint.get("tts_model_type", "")),
                   str(checkpoint.get("tts_model_size", "")), dev, dt, attn, check_mode(mode))
