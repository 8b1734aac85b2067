"""GPU tests: collected everywhere and skipped, with the reason, where there is no CUDA device, so a CPU run's
summary counts them. Run them on an NVIDIA GPU with `bash tools/gpu_check.sh`, which runs this folder under both
CUDA allocator backends; CI prints which commit they last passed at (tools/gpu_check_age.py)."""

from pathlib import Path

import pytest
import torch

from morph.api import MorphTTS

NO_GPU = "no CUDA device here: run bash tools/gpu_check.sh on an NVIDIA GPU"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


@pytest.fixture(scope="session")
def cuda_tts(tiny_dir):
    """The tiny model on the GPU in fp32: the fast modes must give the op-by-op codes there."""
    return MorphTTS.load(str(tiny_dir), device="cuda", dtype="fp32")


@pytest.fixture(scope="session")
def voices(cuda_tts, ref_wave):
    return {"xvector": cuda_tts.make_voice(ref_wave, 24000),
            "icl": cuda_tts.make_voice(ref_wave, 24000, transcript="A short reference sentence.")}


@pytest.fixture(scope="session")
def ref_wave():
    import numpy as np

    rng = np.random.RandomState(0)
    t = np.arange(2 * 24000) / 24000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.randn(t.size)) \
        .astype(np.float32)
