"""`cli.py serve`: its flags are checked before the model loads, and the server it starts answers the pack's load test
(bench/serve.py, which starts it as a user would, saves a voice and streams speech from it) on the tiny model."""

from __future__ import annotations

import pytest

import cli
from bench import serve as load_test


@pytest.mark.parametrize("flags,message", [
    (["--batch-size", "0"], "error: --batch-size must be >= 1, got 0"),
    (["--max-frames", "0"], "error: --max-frames must be >= 1, got 0"),
    (["--temperature", "0"], "error: --temperature must be > 0"),
    (["--seed", "-2"], "error: --seed must be >= 0"),
    (["--kv-cache-gib", "0"], "error: --kv-cache-gib must be > 0"),
])
def test_bad_flags_are_refused_before_loading(flags, message, capsys, no_load):
    assert cli.main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_command_is_known(capsys):
    assert cli.main(["serv"]) == 2
    assert "did you mean serve?" in capsys.readouterr().err


def test_the_server_it_starts_streams_speech_to_the_load_test(tiny_dir, tmp_path):
    report = load_test.main(["--serve", f"--model {tiny_dir} --device cpu --voices {tmp_path / 'voices'} "
                                       "--batch-size 4 --api-key k --kv-cache-gib 0.001", "--api-key", "k", "--rates", "2",
                             "--duration", "2", "--json", str(tmp_path / "serve.json")])
    summary = report["rates"][0]["summary"]
    assert report["complete"] and report["voice_made"]
    assert summary["sent"] >= 1 and summary["ok"] == summary["sent"] and not summary["errors"]
    assert summary["audio_s_total"] > 0 and summary["ttfa_p50_s"] < summary["e2e_p50_s"]
    assert (tmp_path / "voices" / "alice.safetensors").is_file()
