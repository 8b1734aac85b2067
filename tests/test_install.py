"""Installing the pack into an existing environment keeps its torch, torchaudio and transformers."""

import json
import os
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


def pip_report(*args) -> list[dict]:
    """The metadata of what `pip install ARGS` would install here."""
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                          "--disable-pip-version-check", *args],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    if run.returncode != 0:
        pytest.fail(f"pip --dry-run failed: {run.stderr[-2000:]}")
    return [item["metadata"] for item in json.loads(run.stdout)["install"]]


def pip_dry_run(*args) -> list[str]:
    return [metadata["name"].lower() for metadata in pip_report(*args)]


def test_the_readme_install_changes_neither_torch_nor_transformers():
    """The README's two install steps, resolved by pip against this environment."""
    would_install = pip_dry_run("-r", "requirements.txt") + pip_dry_run("--no-deps", "qwen-tts==0.1.1")
    assert not set(would_install) & (KEPT | NEVER), would_install


def test_install_py_installs_qwen_tts_without_its_pins():
    source = (ROOT / "install.py").read_text()
    assert '"--no-deps"' in source and 'QWEN_TTS = "qwen-tts==0.1.1"' in source


def source_copy(tmp_path: Path) -> Path:
    """A copy of what the package is built from (a build writes into its source tree)."""
    import shutil

    src = tmp_path / "src"
    for name in ("pyproject.toml", "requirements.txt", "README.md", "LICENSE"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for package in ("morph", "postprocess"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_the_servers_and_rays_extras_install_without_touching_torch_or_transformers(tmp_path):
    """The README's `pip install '.[serve]'` (and docs/scripts.md's '.[ray]'), resolved by pip in this environment."""
    would_install = pip_report(f"{source_copy(tmp_path)}[serve,ray]")
    [pack] = [m for m in would_install if m["name"] == "comfyui-qwen3-tts-morph"]
    assert {"serve", "ray"} <= set(pack["provides_extra"])  # pip installs a missing extra's nothing, with a warning
    names = {m["name"].lower() for m in would_install}
    assert not names & (KEPT | NEVER | {"qwen-tts"}), names


def built_wheel(tmp_path: Path) -> Path:
    """`pip wheel .` of a copy of what the package is built from."""
    src = source_copy(tmp_path)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        pytest.fail(f"pip wheel . failed: {run.stderr[-2000:]}")
    return next((tmp_path / "dist").glob("*.whl"))


def readme_api_example() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert 'MorphTTS.load("Qwen/Qwen3-TTS-12Hz-0.6B-Base")' in block
    return block


def test_pip_install_dot_gives_an_importable_package_and_the_readme_example_runs_anywhere(tmp_path, tiny_dir):
    import zipfile

    import numpy as np
    import soundfile as sf

    wheel = built_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith("METADATA"))
    assert tops == {"morph", "postprocess"}
    requires = [line.split(":", 1)[1].strip().lower() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert not [r for r in requires if r.split("<")[0].split(">")[0].split("=")[0].strip() in KEPT | NEVER | {"qwen-tts"}
                and not r.startswith("transformers")]
    assert [r for r in requires if r.startswith("transformers")] == ["transformers<6,>=4.57.3"]  # a range, never a pin

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check",
                    "--target", str(target), str(wheel)], check=True, capture_output=True, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    t = np.arange(48000) / 24000
    sf.write(work / "me.wav", (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))), 24000)
    # The README's example as written, on the tiny checkpoint instead of the 2 GB download.
    example = readme_api_example().replace('"Qwen/Qwen3-TTS-12Hz-0.6B-Base"', repr(str(tiny_dir)))
    example += "\nimport morph; print('from', morph.__file__)\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", example], cwd=work, env=dict(env, PYTHONPATH=str(target)),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"from {target}" in run.stdout
    assert sf.info(str(work / "hello.wav")).samplerate == 24000


def test_every_package_of_the_pack_is_in_the_install():
    """pyproject.toml lists the packages `pip install .` installs: a folder of morph/ left out of it imports from the
    clone and fails from site-packages."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("morph/**/__init__.py")}
    assert found and not found - listed, sorted(found - listed)
