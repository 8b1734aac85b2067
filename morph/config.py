"""One model's load, resolved: the record every front end's load goes through (MorphTTS.load), and what a script
job's fingerprints say of the model (morph/script_job.py job_context), known with or without loading it.

    config = ModelConfig.resolve("Qwen/Qwen3-TTS-12Hz-0.6B-Base", locate_checkpoint(...), device="auto")
    config.device, config.dtype, config.attention   # "auto" resolved on this machine: cuda:0, torch.bfloat16, sdpa

A Ray worker on another machine, and the server's engine process, are given the options and resolve them where they
load (auto may mean another device there)."""

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
