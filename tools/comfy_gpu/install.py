"""Install and staging: ComfyUI's missing wheels and the pack, installed as the README says, offline; random
checkpoints under the folder names the workflows load; the default voice under each clip name they load."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from .wheels import comfyui_version, manifest_for, parts

ROOT = Path(__file__).resolve().parents[2]
PACK_FOLDER = "comfyui-qwen3-tts-morph"  # the folder name the README's install gives the pack
# What a user's clone does not hold: build outputs, environments, the carried checkout and wheels.
NOT_COPIED = {".git", ".whl", ".comfyui", ".gl", "__pycache__", ".pytest_cache", ".hypothesis", "out", "output",
              "models", "results"}
VARIANT_OF = {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}
DEFAULT_VOICE = ROOT / "assets" / "default_voice.wav"


def load_workflow_tools():
    """The repo's UI -> API converter (tests/nodes/workflow_tools.py), loaded by path so that the
    tests package and its fixtures are not imported into this process."""
    spec = importlib.util.spec_from_file_location("workflow_tools", ROOT / "tests" / "nodes" / "workflow_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_logged(cmd, log: list, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    t0 = time.time()
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log.append({"cmd": " ".join(map(str, cmd)), "rc": result.returncode, "s": round(time.time() - t0, 2),
                "tail": (result.stdout + result.stderr)[-1500:]})
    if result.returncode:
        raise RuntimeError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def git_head() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def changed_since_staging(listing: Path, root: Path = ROOT) -> list[str]:
    """The pack's files that differ from the staged commit's: `listing` is `git ls-files -s` of them at staging
    (tools/comfy_gpu_run_stage.sh), each file's blob hash recomputed here, where the copy may have no .git."""
    changed = []
    for line in listing.read_text().splitlines():
        meta, path = line.split("\t", 1)
        file = root / path
        data = file.read_bytes() if file.is_file() else None
        blob = None if data is None else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if blob != meta.split()[1]:
            changed.append(path)
    return changed


def install(python: str, comfy: Path, args, log: list) -> dict:
    """ComfyUI's missing packages, then the pack as the README installs it, offline; the versions it runs on."""
    version = args.comfyui_version or comfyui_version(comfy)
    manifest = manifest_for(version)
    wheels = Path(args.wheels).resolve()
    # The wheels may have come in parts, over several device calls (tools/comfy_gpu_run_stage.sh): all must be here.
    stamp_file = comfy / "wheel_parts.txt"
    stamp = stamp_file.read_text().strip() if stamp_file.is_file() else None
    folders, missing = parts(wheels, stamp) if wheels.is_dir() else ([], [])
    if missing:
        raise RuntimeError(f"wheels missing from {wheels}: {', '.join(missing)}; make the device call carrying each first")
    find_links = ["--no-index"] + [arg for folder in folders for arg in ("--find-links", str(folder))]
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir"] + find_links
    if manifest.get("server"):
        run_logged(pip + ["--no-deps"] + manifest["server"], log)
    pack = comfy / "custom_nodes" / PACK_FOLDER
    if pack.exists():
        shutil.rmtree(pack)
    # The checkout may sit inside the repository (the device copy carries it as .comfyui): never copy it into itself.
    shutil.copytree(ROOT, pack, ignore=lambda d, names: [n for n in names if n in NOT_COPIED or n.startswith(".venv")
                                                         or (Path(d) / n).resolve() == comfy])
    run_logged(pip + ["-r", "requirements.txt"], log, cwd=pack)
    run_logged(pip + ["--no-deps", "qwen-tts==0.1.1"], log, cwd=pack)
    # Builds the random checkpoints (not part of the pack's install).
    if manifest.get("tools"):
        run_logged(pip + ["--no-deps"] + manifest["tools"], log)
    versions = run_logged([python, "-c", "import sys, torch, transformers; print(sys.version.split()[0], "
                           "torch.__version__, transformers.__version__)"], log).stdout.split()
    return {"comfyui": version, **dict(zip(("python", "torch", "transformers"), versions[:3]))}


def loaded_names(ui: dict) -> tuple[set[str], set[str]]:
    """The model names and the audio file names the workflows load."""
    model_names, audio_names = set(), set()
    for wf in ui.values():
        for node in wf["nodes"]:
            if node["type"] == "Qwen3TTSMorphLoadModel":
                model_names.add(node["widgets_values"][0])
            if node["type"] == "LoadAudio":
                audio_names.add(node["widgets_values"][0])
    return model_names, audio_names


def start_checkpoints(python: str, models_dir: Path, model_names: set[str], args) -> dict:
    """Start building a random checkpoint for each model name, all at once; {folder: (process, waiter, size, variant)}."""
    models_dir.mkdir(parents=True, exist_ok=True)
    builds = {}
    threads = str(max(1, (os.cpu_count() or 2) // max(1, len(model_names))))
    for name in sorted(model_names):
        folder = name.split("/")[-1]
        variant = next((v for k, v in VARIANT_OF.items() if k in folder), "base")
        size = args.size if "1.7B" not in folder or args.size.startswith("tiny") else (args.size_17 or "1.7b")
        if args.size_17 and "1.7B" in folder:
            size = args.size_17
        target = models_dir / folder
        if target.exists():
            shutil.rmtree(target)
        cmd = [python, "-m", "bench.random_model", "--size", size, "--variant", variant, "--out", str(target),
               "--dtype", "float32" if args.cpu else "bfloat16"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        waiter = threading.Thread(target=lambda p=proc: setattr(p, "log_tail", p.communicate()[0][-2000:]))
        waiter.start()
        builds[folder] = (proc, waiter, size, variant)
    return builds


def finish_checkpoints(builds: dict, models_dir: Path, t_build: float) -> dict:
    """Wait for every build; {folder: {size, variant, s}}, s the seconds until its last file was written."""
    done = {}
    for folder, (proc, waiter, size, variant) in builds.items():
        waiter.join(900)
        if proc.returncode != 0:
            raise RuntimeError(f"building {folder} failed:\n{getattr(proc, 'log_tail', '')}")
        built = max(f.stat().st_mtime for f in (models_dir / folder).rglob("*") if f.is_file())
        done[folder] = {"size": size, "variant": variant, "s": round(built - t_build, 1)}
    return done


def stage_voices(comfy: Path, audio_names: set[str]) -> dict:
    """The bundled default voice in ComfyUI's input/ under each clip name a workflow loads."""
    input_dir = comfy / "input"
    input_dir.mkdir(exist_ok=True)
    for name in audio_names:
        shutil.copy(DEFAULT_VOICE, input_dir / name)
    return {n: "assets/default_voice.wav" for n in sorted(audio_names)}
