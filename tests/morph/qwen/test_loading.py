"""Finding checkpoints (local folders, models folders, the Hugging Face cache, downloads; a hub id that cannot be
fetched: test_checkpoints.py), the device, dtype and attention choices, and moving a loaded model."""

import shutil

import numpy as np
import pytest
import torch

from morph.qwen.checkpoints import FILES, check_source, locate_checkpoint, missing_files
from morph.qwen.loading import resolve_attention, resolve_device, resolve_dtype


def test_folder_by_path_and_by_name_in_a_models_dir(tiny_dir):
    assert locate_checkpoint(str(tiny_dir), []) == tiny_dir
    assert locate_checkpoint(tiny_dir.name, [tiny_dir.parent]) == tiny_dir
    # a hub id resolves to its local copy, named after the repo, when one is there
    assert locate_checkpoint(f"Qwen/{tiny_dir.name}", [tiny_dir.parent]) == tiny_dir


@pytest.mark.parametrize("name", FILES)
def test_each_required_file_is_named_when_missing(tiny_dir, tmp_path, name):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    for path in [broken / name] + ([broken / "tokenizer.json"] if name in ("vocab.json", "merges.txt") else []):
        path.unlink(missing_ok=True)
    assert missing_files(broken) == [name]
    with pytest.raises(FileNotFoundError, match=f"missing {name}. A checkpoint folder holds config.json, "):
        locate_checkpoint(str(broken), [])


def test_the_file_list_is_what_loading_really_needs(tiny_dir, tmp_path):
    """A folder holding exactly FILES loads and speaks (tokenizer.json and the top-level
    preprocessor_config.json are extras the real checkpoints may or may not ship)."""
    from morph.api import MorphTTS

    lean = tmp_path / "lean"
    for name in FILES:
        (lean / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_dir / name, lean / name)
    tts = MorphTTS.load(str(lean), device="cpu", dtype="fp32", attention="sdpa")
    import numpy as np

    voice = tts.make_voice(0.3 * np.sin(np.arange(48000) / 9.0).astype(np.float32), 24000)
    from morph.settings import GenerationSettings

    assert tts.clone("Hi.", voice, settings=GenerationSettings(seed=0, max_new_tokens=3)).size > 0


def test_unknown_local_name_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no model folder 'nothing-here' \\(looked in {tmp_path}\\); "
                                                "give the path of a checkpoint folder"):
        locate_checkpoint("nothing-here", [tmp_path])


def test_a_name_close_to_a_folder_or_a_known_model_says_which(tmp_path):
    (tmp_path / "my-voice-model").mkdir()
    with pytest.raises(FileNotFoundError, match=f"no model folder 'my-voice-modle' \\(looked in {tmp_path}\\): did you "
                                                "mean my-voice-model\\? Or give the path of a checkpoint folder"):
        check_source("my-voice-modle", [tmp_path])
    with pytest.raises(FileNotFoundError, match=r": did you mean Qwen3-TTS-12Hz-1.7B-Base\? Or give"):
        check_source("Qwen3-TTS-12Hz-1.7B-Bsae", [tmp_path])
    assert check_source("Qwen/Qwen3-TTS-12Hz-1.7B-Base", [tmp_path]) is None  # a hub id: looked up when it loads


def test_without_a_download_folder_the_api_downloads_into_the_hugging_face_cache(tmp_path, monkeypatch, tiny_dir):
    import huggingface_hub

    calls = []

    def download(repo_id, local_dir=None, local_files_only=False):
        calls.append((repo_id, local_dir, local_files_only))
        if local_files_only:
            raise FileNotFoundError("not in the cache")
        return str(tiny_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert locate_checkpoint("Qwen/Some-Model") == tiny_dir
    assert calls == [("Qwen/Some-Model", None, True), ("Qwen/Some-Model", None, False)]


def test_a_model_already_in_the_hugging_face_cache_is_used_offline(tmp_path, monkeypatch, tiny_dir):
    """A real cache layout (models--owner--name/snapshots/<rev>, refs/main), read by huggingface_hub itself."""
    cache = tmp_path / "hub"
    repo = cache / "models--Qwen--Cached-Model"
    snapshot = repo / "snapshots" / ("a" * 40)
    shutil.copytree(tiny_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert locate_checkpoint("Qwen/Cached-Model", [tmp_path / "empty"], tmp_path / "dl") == snapshot


def test_corrupt_weights_are_a_clear_error(tiny_dir, tmp_path):
    from morph.api import MorphTTS

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


def test_devices_this_machine_lacks_are_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda' is not available: this PyTorch sees no CUDA GPU; choose"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="device 'mps' is not available: MPS needs an Apple-silicon Mac"):
        resolve_device("mps")
    assert resolve_device("auto") == torch.device("cpu")


def test_moving_the_model_drops_the_tensors_upstream_keeps_outside_its_parameters(tiny_tts, ref_audio):
    """Mimi's cached codebooks and the talker's rope_deltas are plain attributes that .to() does not
    move: after "Unload models" they stayed on the GPU. Moving the model drops them; the next run
    rebuilds them and gives the same result."""
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    from morph.settings import GenerationSettings

    codebooks = [m for m in tiny_tts.tts.model.speech_tokenizer.model.modules() if isinstance(m, MimiEuclideanCodebook)]
    settings = GenerationSettings(seq_groups=5, seed=1, max_new_tokens=6)
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    audio = tiny_tts.clone("Moved, then run again.", voice, "English", settings)
    assert codebooks and any(m._embed is not None for m in codebooks)
    assert tiny_tts.tts.model.talker.rope_deltas is not None
    tiny_tts.to("cpu")
    assert all(m._embed is None for m in codebooks) and tiny_tts.tts.model.talker.rope_deltas is None
    again = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    assert torch.equal(voice.ref_code, again.ref_code)
    assert np.array_equal(audio, tiny_tts.clone("Moved, then run again.", again, "English", settings))


@pytest.mark.parametrize("asked", [False, True])
def test_transformers_loading_bars_show_only_when_asked_and_are_put_back(tiny_dir, monkeypatch, asked):
    """The Python API's load, as the CLI's: no "Loading weights" bars unless progress_bars=True; transformers' own
    setting is left as it was."""
    import qwen_tts
    from transformers.utils import logging as transformers_logging

    from morph.api import MorphTTS

    load, seen = qwen_tts.Qwen3TTSModel.from_pretrained, []

    def spy(*args, **kwargs):
        seen.append(transformers_logging.is_progress_bar_enabled())
        return load(*args, **kwargs)

    monkeypatch.setattr(qwen_tts.Qwen3TTSModel, "from_pretrained", spy)
    transformers_logging.enable_progress_bar()
    MorphTTS.load(str(tiny_dir), device="cpu", dtype="fp32", attention="sdpa", progress_bars=asked)
    assert seen == [asked] and transformers_logging.is_progress_bar_enabled()
