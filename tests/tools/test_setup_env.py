"""The README's set-up (tools/setup_env.sh) installs torch and the pack's runtime needs, nothing for the tests or the
server; its --cpu takes PyTorch's CPU-only torch; a torch already there is kept. The test command installs the test
extras itself, and they hold the pack's serve and ray extras, so CI tests what users install.

The script runs for real against a stand-in VENV/bin/python that records each call instead of installing."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIP = "-m pip --disable-pip-version-check -q install"
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  "-c import torch") exit "$HAVE_TORCH" ;;
  -) cat > /dev/null ;;
esac
"""


def setup_calls(tmp_path: Path, *flags: str, transformers: str = "", torch: bool = False) -> list[str]:
    """The installing calls `bash tools/setup_env.sh FLAGS VENV TRANSFORMERS` makes, in order."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {"PATH": "/usr/bin:/bin", "CALLS": str(calls), "HAVE_TORCH": "0" if torch else "1"}
    run = subprocess.run(["bash", "tools/setup_env.sh", *flags, str(venv), transformers], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return [line for line in calls.read_text().splitlines() if line != "-c import torch"]


RUNTIME = [f"{PIP} -r requirements.txt", "install.py", "-"]  # the README's install steps, then the version line


def test_the_setup_installs_the_tested_torch_and_the_runtime_needs_only(tmp_path):
    assert setup_calls(tmp_path) == [f"{PIP} torch==2.11.0 torchaudio==2.11.0", *RUNTIME]


def test_cpu_takes_pytorchs_cpu_only_torch(tmp_path):
    calls = setup_calls(tmp_path, "--cpu")
    assert calls == [f"{PIP} torch==2.11.0 --index-url https://download.pytorch.org/whl/cpu", *RUNTIME]


@pytest.mark.parametrize("flags", [(), ("--cpu",)])
def test_a_torch_already_there_is_kept(tmp_path, flags):
    assert setup_calls(tmp_path, *flags, torch=True) == RUNTIME


def test_a_transformers_release_is_installed_before_the_pack(tmp_path):
    calls = setup_calls(tmp_path, transformers="4.57.3", torch=True)
    assert calls == [f"{PIP} transformers==4.57.3", *RUNTIME]


def test_the_test_command_installs_the_test_extras_after_the_setup():
    lines = (ROOT / "tools/test.sh").read_text(encoding="utf-8").splitlines()
    setup = next(i for i, line in enumerate(lines) if line.strip().startswith("bash tools/setup_env.sh"))
    extras = next(i for i, line in enumerate(lines) if "install -r requirements-test.txt" in line)
    assert setup < extras
    setup = [line for line in (ROOT / "tools/setup_env.sh").read_text(encoding="utf-8").splitlines()
             if not line.lstrip().startswith("#")]
    assert not [line for line in setup if "requirements-test" in line]


def requirement(line: str) -> str:
    return line.split("#")[0].replace(" ", "").lower()


def test_the_test_extras_hold_the_packs_serve_and_ray_extras():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    tested = {requirement(line) for line in (ROOT / "requirements-test.txt").read_text(encoding="utf-8").splitlines()}
    assert set(extras) == {"serve", "ray"}
    for name, needs in extras.items():
        assert {requirement(n) for n in needs} <= tested, name
