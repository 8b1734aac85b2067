"""One qwen_tts, the right one, or a clear refusal: another pack (ComfyUI-Qwen-TTS) puts its own modified copy of
qwen_tts first on sys.path and imports it at start-up. The pack must not run on that copy silently, and must not
break it. The copies run in fresh processes, so this process keeps the installed qwen-tts."""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from morph.qwen import compat

ROOT = Path(__file__).resolve().parents[3]

# argv: a folder for the other pack's copy, and when that pack imports it ("first" on sys.path only, or
# "imported" at start-up, before the pack's own import)
CHILD = r'''
import importlib.util, shutil, sys
from pathlib import Path

pack, when = Path(sys.argv[1]), sys.argv[2]
installed = Path(importlib.util.find_spec("qwen_tts").origin).parent
shutil.copytree(installed, pack / "qwen_tts")
init = pack / "qwen_tts" / "__init__.py"
init.write_text(init.read_text() + "\nBUNDLED_BY_ANOTHER_PACK = True\n")  # the other pack's modification
sys.path.insert(0, str(pack))
if when == "imported":  # that pack imports its modified copy at start-up; ours needs the shims on transformers 5
    from morph.qwen.compat import import_qwen_tts
    try:
        import_qwen_tts()
    except ImportError:
        pass
    assert sys.modules["qwen_tts"].BUNDLED_BY_ANOTHER_PACK

from morph.qwen.compat import import_qwen_tts

try:
    import_qwen_tts()
    print("ran on:", sys.modules["qwen_tts"].__file__)
except ImportError as e:
    print("refused:", e)
import qwen_tts
print("the other pack's copy works:", getattr(qwen_tts, "BUNDLED_BY_ANOTHER_PACK", False),
      callable(qwen_tts.Qwen3TTSModel.from_pretrained))
'''


@pytest.mark.parametrize("when", ["first", "imported"])
def test_another_packs_qwen_tts_is_refused_with_its_folder_and_the_fix(when, tmp_path):
    pack = tmp_path / "custom_nodes" / "ComfyUI-Qwen-TTS"
    pack.mkdir(parents=True)
    run = subprocess.run([sys.executable, "-c", CHILD, str(pack), when], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    refused = [line for line in run.stdout.splitlines() if line.startswith("refused:")]
    assert refused, run.stdout
    assert f"qwen_tts was imported from {pack / 'qwen_tts'}, not from the installed qwen-tts" in refused[0]
    assert f"disable the pack that holds {pack}" in refused[0] and "restart ComfyUI" in refused[0]
    assert "the other pack's copy works: True True" in run.stdout


def test_the_installed_qwen_tts_is_accepted():
    qwen_tts = compat.import_qwen_tts()
    assert Path(qwen_tts.__file__).resolve().parent == Path(metadata.distribution("qwen-tts").locate_file("qwen_tts")).resolve()


def test_another_qwen_tts_release_is_refused_with_the_install_command(monkeypatch):
    qwen_tts = compat.import_qwen_tts()
    real = metadata.distribution("qwen-tts")

    class Newer:
        version = "0.2.0"
        locate_file = staticmethod(real.locate_file)

    monkeypatch.setattr(metadata, "distribution", lambda name: Newer())
    with pytest.raises(ImportError, match=r"qwen-tts 0\.2\.0 is installed .*tested on 0\.1\.1 only\. Fix, with the "
                                          r"Python that runs ComfyUI: .* -m pip install --no-deps qwen-tts==0\.1\.1"):
        compat._check_origin(qwen_tts)
