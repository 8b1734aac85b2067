"""Finding checkpoints: local folders, models folders, hub ids, and the offline error."""

import shutil

import pytest
import torch

from morph.loading import locate_checkpoint, resolve_attention, resolve_device, resolve_dtype


def test_folder_by_path_and_by_name_in_a_models_dir(tiny_dir):
    assert locate_checkpoint(str(tiny_dir), []) == tiny_dir
    assert locate_checkpoint(tiny_dir.name, [tiny_dir.parent]) == tiny_dir
    # a hub id resolves to its local copy, named after the repo, when one is there
    assert locate_checkpoint(f"Qwen/{tiny_dir.name}", [tiny_dir.parent]) == tiny_dir


def test_incomplete_folder_names_the_missing_files(tiny_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    shutil.rmtree(broken / "speech_tokenizer")
    with pytest.raises(FileNotFoundError, match="missing speech_tokenizer/config.json"):
        locate_checkpoint(str(broken), [])


def test_unknown_local_name_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model folder named 'nothing-here'"):
        locate_checkpoint("nothing-here", [tmp_path])


def test_offline_hub_id_says_where_to_put_the_files(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match=f"put the checkpoint's files .* into {tmp_path}/Some-Model"):
        locate_checkpoint("Qwen/Some-Model", [tmp_path], tmp_path)


def test_corrupt_weights_are_a_clear_error(tiny_dir, tmp_path):
    from morph.engine import MorphTTS

    broken = tmp_path / "corrupt"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RuntimeError, match="incomplete or corrupt"):
        MorphTTS.load(str(broken), device="cpu", dtype="fp32")


def test_device_dtype_attention_resolution():
    cpu = torch.device("cpu")
    assert resolve_device("cpu") == cpu
    assert resolve_dtype("auto", cpu) == torch.float32 and resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_attention("auto", cpu, torch.float32) == "sdpa"
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("int8", cpu)
    with pytest.raises(ValueError, match="attention must be"):
        resolve_attention("magic", cpu, torch.float32)
