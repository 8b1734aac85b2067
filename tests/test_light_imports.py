"""Loading is light: the plain records import no torch, and the nodes load the engine's decode path and its
Triton kernels only when a node loads a model (cli.py's own check is in tests/test_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "transformers", "qwen_tts", "morph.decode", "morph.kernels", "morph.api")


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code` from the repository root."""
    run = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def heavy(modules: list[str], prefix: str = "") -> list[str]:
    return [m for m in modules if any(m == prefix + h or m.startswith(prefix + h + ".") for h in HEAVY)]


def test_the_settings_and_the_package_import_no_torch():
    assert heavy(loaded_after("import morph.settings; from morph import GenerationSettings")) == []


def test_the_package_exports_load_on_first_use():
    modules = loaded_after("from morph import MorphTTS")
    assert "morph.api" in modules and "morph.reference.patch" in modules


def test_loading_the_nodes_under_comfyui_loads_no_decode_path():
    code = ("import tempfile\nfrom tests.nodes import fake_comfy\nfrom tests.nodes.conftest import PACK_NAME, "
            "import_pack\nfake_comfy.install(tempfile.mkdtemp())\npack = import_pack()\n"
            "assert len(pack.NODE_CLASS_MAPPINGS) > 5")
    modules = loaded_after(code)
    pack = "qwen3tts_morph_pack_under_test."
    assert pack + "nodes.batch" in modules and pack + "morph.render" in modules
    assert heavy(modules, pack) == [] and "triton" not in modules
