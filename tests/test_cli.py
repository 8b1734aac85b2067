"""The README's main job, end to end on a tiny model: text in, a valid 24 kHz wav out."""

import os
import subprocess
import sys
from pathlib import Path

import soundfile as sf

import cli

ROOT = Path(__file__).resolve().parents[1]


def test_cli_writes_a_24k_wav_with_the_default_voice(tiny_dir, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    code = cli.main(["--text", "Hello from the command line.", "--model", str(tiny_dir), "--out", str(out),
                     "--device", "cpu", "--seq-groups", "5", "--seed", "3", "--max-new-tokens", "10"])
    assert code == 0
    audio, sr = sf.read(out)
    assert sr == 24000 and audio.ndim == 1 and audio.size > 0
    assert abs(abs(audio).max() - 10 ** (-3 / 20)) < 1e-3  # smoothed and normalised to -3 dBFS
    assert "x real time" in capsys.readouterr().out


def test_cli_offline_without_a_local_copy_says_where_to_put_the_files(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "cli.py", "--text", "Hi", "--models-dir", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert "put the checkpoint's files" in run.stderr and str(tmp_path) in run.stderr
