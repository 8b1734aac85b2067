"""Installing the pack into an existing environment keeps its torch, torchaudio and transformers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEPT = {"torch", "torchaudio", "transformers"}
NEVER = {"gradio"}


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(line.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower())
    return names


def test_requirements_never_name_torch_torchaudio_or_qwen_tts_with_its_pins():
    names = requirement_names(ROOT / "requirements.txt")
    assert not names & {"torch", "torchaudio", "gradio", "qwen-tts"}
    assert "transformers" in names  # a range, so the user's version stays: checked below


def pip_dry_run(*args) -> list[str]:
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                          "--disable-pip-version-check", *args],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    if run.returncode != 0:
        pytest.fail(f"pip --dry-run failed: {run.stderr[-2000:]}")
    report = json.loads(run.stdout)
    return [item["metadata"]["name"].lower() for item in report["install"]]


def test_the_readme_install_changes_neither_torch_nor_transformers():
    """The README's two install steps, resolved by pip against this environment."""
    would_install = pip_dry_run("-r", "requirements.txt") + pip_dry_run("--no-deps", "qwen-tts==0.1.1")
    assert not set(would_install) & (KEPT | NEVER), would_install


def test_install_py_installs_qwen_tts_without_its_pins():
    source = (ROOT / "install.py").read_text()
    assert '"--no-deps"' in source and 'QWEN_TTS = "qwen-tts==0.1.1"' in source
