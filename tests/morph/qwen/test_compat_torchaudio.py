"""qwen-tts imports torchaudio only for its 25 Hz tokenizer, which the pack never runs: the pack's import of
qwen_tts works without torchaudio, or with one that fails to import (built for another torch or CUDA), and
leaves no fake torchaudio behind for other packs. Each case runs in a fresh process, on the tiny model."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# argv: how torchaudio fails ("missing" or "oserror"), the tiny model's folder
CHILD = r'''
import importlib.machinery, logging, sys
how, model = sys.argv[1], sys.argv[2]

def ours(name):
    return name.partition(".")[0] == "torchaudio"

if how == "missing":  # as if never installed: not found on any path
    path_spec = importlib.machinery.PathFinder.find_spec
    importlib.machinery.PathFinder.find_spec = classmethod(
        lambda cls, name, path=None, target=None: None if ours(name) else path_spec(name, path, target))
else:  # installed, but its library does not load against this torch
    class Broken:
        def find_spec(self, name, path=None, target=None):
            return importlib.machinery.ModuleSpec(name, self, is_package=True) if ours(name) else None
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            raise OSError("libtorchaudio.so: undefined symbol: _ZN3c105ErrorC2E (a torch of another build)")
    sys.meta_path.insert(0, Broken())

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
import numpy as np
from morph.api import MorphTTS
from morph.settings import GenerationSettings

tts = MorphTTS.load(model, device="cpu", dtype="fp32", attention="sdpa")
left = sorted(name for name in sys.modules if ours(name))
voice = tts.make_voice(0.3 * np.sin(np.arange(48000) / 9.0), 24000, transcript="Some words.")
audio = tts.clone("Hi there.", voice, settings=GenerationSettings(seed=0, max_new_tokens=4))
from qwen_tts.core.tokenizer_25hz.vq import speech_vq
try:
    speech_vq.kaldi.fbank
except ImportError as e:
    print("25 Hz:", e)
print("torchaudio modules left:", left)
print("samples:", audio.size)
'''


@pytest.mark.parametrize("how", ["missing", "oserror"])
def test_qwen_tts_loads_and_speaks_without_a_working_torchaudio(how, tiny_dir):
    run = subprocess.run([sys.executable, "-c", CHILD, how, str(tiny_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "torchaudio modules left: []" in run.stdout
    assert "samples: 0" not in run.stdout and "samples:" in run.stdout
    assert "25 Hz: torchaudio is unavailable (" in run.stdout and "this pack runs 12 Hz models only" in run.stdout
    notes = [line for line in run.stderr.splitlines() if "torchaudio is unavailable" in line]
    assert len(notes) == 1 and "its 25 Hz tokenizer is off" in notes[0], run.stderr[-3000:]
    assert ("ModuleNotFoundError" if how == "missing" else "OSError: libtorchaudio.so") in notes[0]


def test_a_working_torchaudio_is_what_qwen_tts_gets():
    try:
        import torchaudio.compliance.kaldi  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"no working torchaudio here: {exc}")
    probe = ("import sys\nfrom morph.qwen.compat import import_qwen_tts\nimport_qwen_tts()\n"
             "from qwen_tts.core.tokenizer_25hz.vq import speech_vq\n"
             "print(speech_vq.kaldi is sys.modules['torchaudio.compliance.kaldi'], callable(speech_vq.kaldi.fbank))")
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.stdout.strip() == "True True", run.stderr[-3000:]
    assert "torchaudio is unavailable" not in run.stderr
