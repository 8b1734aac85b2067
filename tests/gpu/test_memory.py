"""What the pack declares to ComfyUI (morph/memory.py) is what a render takes, at the real 0.6B dims in bf16 and in the
default mode: within 0.8-1.25 of the peak above the render's start in the continuous batch (mode auto), and 0.8-3.0 in
eager mode's static batches (below), x-vector and ICL voices, batch 1 to 64 of 5 s lines and a 60 s line alone; under
cudaMallocAsync the upper bound is taken of the peak plus bench/workload.py's ASYNC_TAKEN_SPREAD, how far runs of the
same renders read apart. The peak is what the process took of the device (bench/workload.py taken_bytes): torch's reserved memory, not
only its allocations, and CUDA's graph pool. The allocator's reserve and the graphs took 1.3-1.5x the allocations' count
at batch 64 of the 256-line script (bench/results/h200x4-2026-11-28c/NOTES.md), where a count of the allocations and the
graphs alone was met.

Each kind is measured in a process of its own, as a ComfyUI server's first render of the pack runs: that one also
allocates what the process keeps from then on whatever runs (cuBLAS's workspace for each of the pack's streams, about
0.06 GiB), which a later render does not need again, so a process that had rendered before measured batch 1 at 0.09 GiB
where a fresh one measured 0.12-0.15 (bench/results/h100-2026-11-24c/NOTES.md). The declaration covers the first render
(whose captures' warm-ups run each codec call op by op) and the second (replaying them). It is asked before each size's
renders, as a host asks: the continuous batch's own streams' workspaces are counted until the process has taken them
(morph/memory.py STREAM_WORKSPACE), at batch 1 here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.lines import script
from bench.random_model import build_random_model
from bench.sentences import reference_wave
from bench.workload import ASYNC_TAKEN_SPREAD, REF_TEXT, eos_held, taken_bytes
from morph.api import MorphTTS
from morph.graphs import trim_graph_memory
from morph.memory import working_memory
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings

FRAMES = 62  # about 5 s
# (rows, frames a row), each list measured in a fresh process, its first size as a server's first render: batches of
# 5 s lines, and one minute-long line alone (past upstream's first codec window of 300 frames, so its codec starts
# windows again behind their context). Each list is a case of its own: eager's minute-long line runs about 100 s, and
# the whole file under one allocator took more than a device call's 600 s, so a call runs a part (`-k 60s`).
SIZES = {"5s-batches": ((1, FRAMES), (8, FRAMES), (32, FRAMES), (64, FRAMES)), "60s-line": ((1, 750),)}


@pytest.fixture(scope="module")
def real_dims(tmp_path_factory):
    return build_random_model(tmp_path_factory.mktemp("0.6b"), "0.6b", "base", seed=0, dtype=torch.bfloat16)


def measure(folder: str, kind: str, mode: str, sizes: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """"rows x frames" -> (peak above the start, declared) for each of `sizes`, in this process (run in a fresh one):
    the larger of the two renders' (bench/workload.py says how a render's is counted)."""
    tts = MorphTTS.load(folder, device="cuda", dtype="bf16", mode=mode)
    device = torch.device("cuda", torch.cuda.current_device())
    voice = tts.make_voice(reference_wave(), 24000, REF_TEXT if kind == "icl" else None)
    batch, got = BatchTTS(tts), {}
    for rows, frames in sizes:
        settings = eos_held(GenerationSettings(seq_groups=5, seed=0, max_new_tokens=frames), frames)
        tts.release_device_state()  # each size from the same start, as ComfyUI loads the model for a run
        lines = [Line(text, voice, "English") for text in script(rows)]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        trim_graph_memory()
        start, peak = taken_bytes(device), 0
        # asked before the render, as a host asks: what the process has taken by then (the cuBLAS workspaces of the
        # pack's streams) is not declared again
        declared = working_memory(tts, [(line.text, line.voice) for line in lines], settings, rows)
        for _ in range(2):  # the first captures the graphs and builds the state for this shape
            torch.cuda.reset_peak_memory_stats()
            batch.render(lines, settings, batch_size=rows)
            torch.cuda.synchronize()
            peak = max(peak, taken_bytes(device, peak=True) - start)
        got[f"{rows} x {frames}"] = (peak, declared)
    return got


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("mode", ["eager", "auto"])
@pytest.mark.parametrize("kind", ["xvector", "icl"])
def test_declared_memory_is_within_a_quarter_of_the_peak(real_dims, kind, mode, sizes):
    code = ("import json, sys; from tests.gpu.test_memory import measure; "
            "print(json.dumps(measure(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))")
    run = subprocess.run([sys.executable, "-c", code, str(real_dims), kind, mode, json.dumps(SIZES[sizes])],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    ratios = {size: (round(declared / peak, 3), round(peak / 2**30, 3), round(declared / 2**30, 3))
              for size, (peak, declared) in got.items()}
    print(kind, mode, "rows x frames: (declared / peak, peak GiB above the start, declared GiB)", ratios)
    # eager (the reference, rarely run on a GPU) declared 1.5-2.8x its ICL peaks on an H100, more than it takes and
    # never less (bench/results/h100-2026-11-27l/NOTES.md); its upstream codec's constants are not refit to it
    most = 1.25 if mode == "auto" else 3.0
    # under cudaMallocAsync runs of the same renders read their peaks up to ASYNC_TAKEN_SPREAD apart
    spread = ASYNC_TAKEN_SPREAD if torch.cuda.get_allocator_backend() == "cudaMallocAsync" else 0
    assert all(0.8 * peak <= declared <= most * (peak + spread) for peak, declared in got.values()), ratios
