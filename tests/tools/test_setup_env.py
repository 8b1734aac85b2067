"""The README's set-up (tools/setup_env.sh) installs torch and the pack's runtime needs, nothing for the tests or the
server; its --cpu takes PyTorch's CPU-only torch, and says the ways round an index it cannot reach; a torch already
there is kept. The test command installs the test extras itself, and they hold the pack's serve and ray extras, so CI
tests what users install.

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
  *--index-url*) [ -z "$INDEX_DOWN" ] || { echo "ERROR: No matching distribution found for torch==2.11.0" >&2; exit 1; } ;;
esac
"""


def setup(tmp_path: Path, *flags: str, transformers: str = "", torch: bool = False,
          index_down: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`bash tools/setup_env.sh FLAGS VENV TRANSFORMERS` and the installing calls it made, in order; with
    `index_down`, a pip that cannot reach the index it is given answers as pip does."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {"PATH": "/usr/bin:/bin", "CALLS": str(calls), "HAVE_TORCH": "0" if torch else "1",
           "INDEX_DOWN": "1" if index_down else ""}
    run = subprocess.run(["bash", "tools/setup_env.sh", *flags, str(venv), transformers], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    return run, [line for line in calls.read_text().splitlines() if line != "-c import torch"]


def setup_calls(tmp_path: Path, *flags: str, transformers: str = "", torch: bool = False) -> list[str]:
    """The installing calls of a set-up that succeeds."""
    run, calls = setup(tmp_path, *flags, transformers=transformers, torch=torch)
    assert run.returncode == 0, run.stderr
    return calls


RUNTIME = [f"{PIP} -r requirements.txt", "install.py", "-"]  # the README's install steps, then the version line


def test_the_setup_installs_the_tested_torch_and_the_runtime_needs_only(tmp_path):
    assert setup_calls(tmp_path) == [f"{PIP} torch==2.11.0 torchaudio==2.11.0", *RUNTIME]


def test_cpu_takes_pytorchs_cpu_only_torch(tmp_path):
    calls = setup_calls(tmp_path, "--cpu")
    assert calls == [f"{PIP} torch==2.11.0 --index-url https://download.pytorch.org/whl/cpu", *RUNTIME]


def test_cpu_says_the_ways_round_an_index_it_cannot_reach_and_installs_nothing_more(tmp_path):
    run, calls = setup(tmp_path, "--cpu", index_down=True)
    venv = tmp_path / "venv"
    assert run.returncode == 1
    assert calls == [f"{PIP} torch==2.11.0 --index-url https://download.pytorch.org/whl/cpu"]  # stopped there
    # pip's own line, then the script's: what failed, and each way round it
    assert run.stderr.startswith("ERROR: No matching distribution found for torch==2.11.0\n")
    assert run.stderr.splitlines()[-1] == (
        "setup_env.sh --cpu: could not install torch 2.11.0 from PyTorch's CPU index "
        "(https://download.pytorch.org/whl/cpu; pip's error is above). If this machine cannot reach it, install a CPU "
        f"torch into {venv} yourself (from a mirror of that index, or a wheel file copied here: {venv}/bin/python -m "
        "pip install FILE.whl), then run this script again: it keeps a torch that is there. Or leave out --cpu: "
        "PyPI's torch runs on the CPU too, with CUDA's libraries (about 3.3 GB more).")


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
