"""What the pack declares to ComfyUI (morph/memory.py) is what a render takes, at the real 0.6B dims in bf16 and in
the default mode: within 0.8-1.25 of the peak allocated above the weights, x-vector and ICL voices, batch 1 to 64
of 5 s lines (bench/batch.py reports the same figures for any configuration)."""

from __future__ import annotations

import pytest
import torch

from bench.batch import script
from bench.random_model import build_random_model
from bench.speed import REF_TEXT, eos_suppressed, reference_wave
from morph.engine import MorphTTS
from morph.memory import working_memory
from morph.scheduler import BatchTTS, Line
from morph.settings import GenerationSettings

FRAMES = 62  # about 5 s


@pytest.fixture(scope="module")
def real_dims(tmp_path_factory):
    folder = build_random_model(tmp_path_factory.mktemp("0.6b"), "0.6b", "base", seed=0, dtype=torch.bfloat16)
    tts = MorphTTS.load(str(folder), device="cuda", dtype="bf16")
    voices = {"xvector": tts.make_voice(reference_wave(), 24000), "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}
    yield tts, voices
    tts.release_device_state()


def peak_and_declared(tts, voice, rows: int) -> tuple[int, int]:
    """The peak above what was allocated before the run (the weights, and what the process keeps whatever runs:
    cuBLAS's workspaces, what earlier tests left), as ComfyUI asks for room beyond what it has loaded."""
    lines = [Line(text, voice, "English") for text in script(rows)]
    settings = GenerationSettings(seq_groups=5, seed=0, max_new_tokens=FRAMES)
    batch = BatchTTS(tts)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    with eos_suppressed(tts, FRAMES):
        batch.render(lines, settings, batch_size=rows)  # warm: graphs and state for this shape
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        batch.render(lines, settings, batch_size=rows)
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start, working_memory(
        tts, [(line.text, line.voice) for line in lines], settings, rows)


@pytest.mark.parametrize("kind", ["xvector", "icl"])
def test_declared_memory_is_within_a_quarter_of_the_peak(real_dims, kind):
    tts, voices = real_dims
    ratios = {}
    for rows in (1, 8, 32, 64):
        tts.release_device_state()  # each size from the same start, as ComfyUI loads the model for a run
        peak, declared = peak_and_declared(tts, voices[kind], rows)
        ratios[rows] = (round(declared / peak, 3), round(peak / 2**30, 3), round(declared / 2**30, 3))
    print(kind, "rows: (declared / peak, peak GiB above the start, declared GiB)", ratios)
    assert all(0.8 <= ratio <= 1.25 for ratio, _, _ in ratios.values()), ratios
