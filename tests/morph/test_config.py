"""The load's one record (morph/config.py): what a load resolves, and a model loaded where it does not run."""

from __future__ import annotations

import logging

import pytest
import torch

import morph.config
from morph.api import MorphTTS
from morph.config import ModelConfig


def test_a_config_resolves_auto_here_and_reads_the_model_from_its_checkpoint(model_dirs, caplog):
    folder = model_dirs("tiny", "custom_voice")
    with caplog.at_level(logging.WARNING, logger="morph"):
        config = ModelConfig.resolve("my-voice-model", folder, mode="compile")
    assert config == ModelConfig("my-voice-model", folder, "custom_voice", "0b6", torch.device("cpu"), torch.float32,
                                 "sdpa", "fused")
    assert "speed mode 'compile' was retired" in caplog.text
    assert ModelConfig.resolve("my-voice-model", folder).mode == "auto"


def test_a_checkpoint_config_without_the_models_kind_gives_none(tmp_path):
    """What the record says of a folder whose config.json does not name the model (the load itself refuses it)."""
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    config = ModelConfig.resolve("somewhere", tmp_path, device="cpu")
    assert (config.variant, config.model_size, config.mode) == ("", "", "auto")


def test_bad_load_options_are_refused_naming_the_option(model_dirs):
    folder = model_dirs("tiny", "custom_voice")
    with pytest.raises(ValueError, match="dtype must be one of auto, bf16"):
        ModelConfig.resolve("my-voice-model", folder, dtype="int8")
    with pytest.raises(ValueError, match="mode must be one of auto, eager"):
        ModelConfig.resolve("my-voice-model", folder, mode="fast")


def test_a_model_placed_elsewhere_is_loaded_as_where_it_runs_resolves(tiny_dir, monkeypatch):
    """A host's memory manager keeps the model on its offload device between runs: loaded there, in the dtype and
    attention kernel of the device it runs on, which its config names."""
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(morph.config, "resolve_load", lambda device, dtype, attention: (gpu, torch.bfloat16, "sdpa"))
    tts = MorphTTS.load(str(tiny_dir), device="cuda", place_on="cpu")
    assert tts.device == torch.device("cpu") and tts.tts.model.dtype == torch.bfloat16
    assert (tts.config.device, tts.config.dtype, tts.source, tts.variant) == (gpu, torch.bfloat16, str(tiny_dir), "base")
