"""A hub id that cannot be fetched (morph/qwen/checkpoints.py): the message says where to put which files and how to
fetch them, and a mistyped id's "did you mean" comes before those instructions."""

import pytest

from morph.qwen.checkpoints import FILES, locate_checkpoint


@pytest.fixture
def offline_hub(monkeypatch):
    import huggingface_hub

    calls = []

    def offline(**kwargs):
        calls.append(kwargs)
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    return calls


def test_offline_hub_id_says_where_to_put_which_files_and_how_to_fetch_them(tmp_path, offline_hub):
    with pytest.raises(FileNotFoundError) as info:
        locate_checkpoint("Qwen/Some-Model", [tmp_path], tmp_path)
    message = str(info.value)
    assert message.startswith("could not download Qwen/Some-Model (OSError: network is unreachable). Offline, ")
    assert f"put the checkpoint's files into {tmp_path}/Some-Model: config.json, generation_config.json" in message
    assert all(name in message for name in FILES)
    assert f"hf download Qwen/Some-Model --local-dir {tmp_path}/Some-Model" in message
    assert "did you mean" not in message.lower()  # no known model comes close
    assert offline_hub[0] == dict(repo_id="Qwen/Some-Model", local_files_only=True)  # the cache was asked first


def test_a_mistyped_hub_id_says_the_one_meant_before_the_offline_instructions(tmp_path, offline_hub):
    with pytest.raises(FileNotFoundError) as info:
        locate_checkpoint("Qwen/Qwen3-TTS-12Hz-0.6B-Bas", [tmp_path], tmp_path)
    message = str(info.value)
    assert message.startswith("could not download Qwen/Qwen3-TTS-12Hz-0.6B-Bas; did you mean "
                              "Qwen/Qwen3-TTS-12Hz-0.6B-Base? (OSError: network is unreachable). Offline, ")
    assert message.count("did you mean") == 1 and "hf download Qwen/Qwen3-TTS-12Hz-0.6B-Bas" in message


def test_a_relative_download_folder_is_named_absolutely(tmp_path, offline_hub, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"into {tmp_path}/models/Some-Model: "):
        locate_checkpoint("Qwen/Some-Model", [], "models")
