"""A script over several GPUs against one, in one call: what `cli.py render --gpus N` gains.

The script: `--lines` lines of mixed length, two x-vector voices alternating. Each text has 1 to 29 characters, so
its frame limit (the engine's default for that text) spans about 5.4 to 15.2 s; EOS is held back, so random
weights end every row exactly at its own limit, as real speech ends each line at its own frame.
- one GPU: `MorphTTS.load` and `ScriptJob.run` in this process (what `cli.py render` runs without --gpus), over the
  first `--baseline-lines` lines;
- N GPUs: `WorkerPool` and its render (what `cli.py render --gpus N` runs) over all `--lines`.
Each side is reported two ways: with start-up (from before its model load to its last file: model load, warm-up,
and for the pool Ray's start) and steady (from its first batch handed out to its last file). Seconds of audio
per wall second, the speed-up of N GPUs over one, and per side the lines, audio seconds and walls, and where its start
went (`start_s`: the one-GPU side's model load, then its voices and context; for the pool, each worker's process start,
the start of its `__init__` after the imports, and its model loaded, from the side's start, then the voices and
context). The one-GPU side's process has loaded the model once already (the warm-up below), so its start is a warm
process's, while each worker is a fresh one. The one-GPU side renders fewer lines (time), so beside the measured
ratio with start-up the report gives the ratio for the same script: the one GPU's start-up plus its steady rate over
all `--lines` (`speedup_with_start_same_script`).
Both sides compute with the same CPU threads, `--threads` (default 1, what Ray gives an actor of one CPU): torch's
intra-op threads and OMP_NUM_THREADS, in this process and in each worker, as each side reports them.
Before either side, one batch is rendered and thrown away, so that Triton's on-disk kernel cache is warm for both
(the first process on a fresh machine compiles for about 10 s; a user's machine pays that once, not per job).
Files go to `--out` (a temporary folder by default) and are removed after each side. Repeat with `--repeats`.

    python -m bench.scale --size tiny --device cpu --lines 48 --baseline-lines 24 --gpus 2 --batch-size 8
    python -m bench.scale --model /tmp/model-0.6b --dtype bf16 --lines 20480 --baseline-lines 2048 --gpus 2 \\
        --batch-size 64 --json out/scale.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import bench
from bench.common import HELD_FRAMES, add_model_args, emit, mixed_texts, run_info, save
from bench.random_model import build_random_model
from bench.sentences import reference_wave
from bench.workload import eos_held
from morph.distributed.job import WorkerPool
from morph.distributed.worker import LineWorker
from morph.api import MorphTTS
from morph.lines.script import parse_script
from morph.lines.store import LineStore
from morph.render import Line
from morph.script_job import ScriptJob, job_context
from morph.settings import SAMPLE_RATE, GenerationSettings, default_max_frames

def script(n: int) -> str:
    return "".join(f"{'AB'[i % 2]}: {text}\n" for i, text in enumerate(mixed_texts(n)))


class ThreadedWorker(LineWorker):
    """A pool's worker with the one-GPU side's torch threads (`load["threads"]`)."""

    def __init__(self, load: dict):
        began = time.time()
        load = dict(load)
        torch.set_num_threads(load.pop("threads"))
        super().__init__(load)
        self.start = dict(process=process_started(), init=began, loaded=time.time())

    def about(self) -> dict:
        return dict(super().about(), **threads(), start=self.start)


def process_started() -> float:
    """When this process started, in time.time()'s clock (Linux's /proc; its fields after the name's parenthesis)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def threads() -> dict:
    """What this process computes with on the CPU: torch's intra-op threads, and OMP_NUM_THREADS as it sees it."""
    return dict(torch_threads=torch.get_num_threads(), omp_num_threads=os.environ.get("OMP_NUM_THREADS"))


class ThreadedPool(WorkerPool):
    worker = ThreadedWorker


def one_gpu(args, folder: Path, parsed, settings: GenerationSettings, out: Path) -> dict:
    start = time.perf_counter()
    tts = MorphTTS.load(str(folder), args.device, args.dtype, args.attention)
    loaded = time.perf_counter()
    voices = make_voices(tts.make_voice)
    lines = [Line(p.text, voices[p.name], "English") for p in parsed]
    context = job_context(tts.config, "English", settings, False)
    with LineStore(out, "one", "bench") as store:
        job = ScriptJob(parsed, lines, store, context)
        steady = time.perf_counter()
        result = job.run(lambda todo, loaded=tts: loaded, settings, args.batch_size, 0.0, who="bench")
    end = time.perf_counter()
    audio = sum(clip.size for clip in result.clips) / SAMPLE_RATE
    del tts, job, result
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return dict(side(len(parsed), audio, end - start, end - steady), **threads(),
                start_s=dict(load=round(loaded - start, 2), voices_context=round(steady - loaded, 2)))


def n_gpus(args, folder: Path, parsed, settings: GenerationSettings, out: Path) -> dict:
    start, began = time.perf_counter(), time.time()
    load = dict(source=str(folder), device=args.device, dtype=args.dtype, attention=args.attention,
                threads=args.threads)
    with ThreadedPool(args.gpus, load, who="bench", packages=[bench]) as pool, \
            LineStore(out, "pool", "bench") as store:
        ready = time.perf_counter()
        voices = make_voices(lambda wave, rate: pool.voice_from_clip(wave, None, "bench"))
        lines = [Line(p.text, voices[p.name], "English") for p in parsed]
        job = ScriptJob(parsed, lines, store, pool.context("English", settings, False))
        steady = time.perf_counter()
        pool.render(job, settings, args.batch_size, 0.0)
        end = time.perf_counter()
        workers = [dict(device=a["device"], torch_threads=a["torch_threads"], omp_num_threads=a["omp_num_threads"])
                   for a in pool.about]
    # where the start went: each worker's process started (Ray's start and its spawn), its __init__ began (the
    # imports its actor class needs) and its model loaded, against this side's start; then the voices and context
    starts = [{k: round(t - began, 2) for k, t in a["start"].items()} for a in pool.about]
    return dict(side(len(parsed), sum(job.lengths.values()) / SAMPLE_RATE, end - start, end - steady),
                workers=workers, start_s=dict(pool_ready=round(ready - start, 2),
                                              voices_context=round(steady - ready, 2), workers=starts))


def make_voices(make) -> dict:
    wave = reference_wave()
    return {"A": make(wave, SAMPLE_RATE), "B": make(wave[::-1].copy(), SAMPLE_RATE)}


def side(lines: int, audio_s: float, with_start_s: float, steady_s: float) -> dict:
    return dict(lines=lines, audio_s=round(audio_s, 1), with_start_s=round(with_start_s, 2),
                steady_s=round(steady_s, 2), x_real_time_with_start=round(audio_s / with_start_s, 1),
                x_real_time_steady=round(audio_s / steady_s, 1))


def same_script(one: dict, many: dict) -> float:
    """N GPUs with start-up against one GPU rendering the same audio: its start-up (load, warm-up) once, then
    its steady rate over all of it."""
    one_s = one["with_start_s"] - one["steady_s"] + one["steady_s"] * many["audio_s"] / one["audio_s"]
    return round(one_s / many["with_start_s"], 3)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--lines", type=int, default=20480)
    p.add_argument("--baseline-lines", type=int, default=2048)
    p.add_argument("--gpus", type=int, default=2, help="workers (GPUs; CPU workers with --device cpu)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-groups", type=int, default=5)
    # one repeat fits a device call (about 430 s on two H200s); repeat the call for a second figure
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="where the files go while a side runs (removed after)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads and OMP_NUM_THREADS of both sides, this process and each Ray worker "
                        "(1: what Ray gives an actor of one CPU, as cli.py render --gpus runs)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    # Both sides alike: set before Ray starts, its workers inherit it (Ray sets OMP_NUM_THREADS only where unset)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    parsed = parse_script(script(args.lines), ["A", "B"])
    settings = eos_held(GenerationSettings(seq_groups=args.seq_groups), HELD_FRAMES)
    limits = [default_max_frames(x.text) for x in parsed]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model or build_random_model(Path(tmp) / "model", args.size, "base", seed=0))
        device = torch.device("cuda" if args.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
        report = dict(run_info(device), gpus=args.gpus, batch_size=args.batch_size, seq_groups=args.seq_groups,
                      threads=args.threads,
                      line_frames=dict(min=min(limits), max=max(limits), mean=round(float(np.mean(limits)), 1)),
                      runs=[], complete=False)
        out = args.out or Path(tmp) / "out"
        report["warm_up"] = one_gpu(args, folder, parsed[:args.batch_size], settings, out)
        shutil.rmtree(out, ignore_errors=True)
        for _ in range(args.repeats):
            run = {}
            for name, render, count in (("one_gpu", one_gpu, args.baseline_lines), ("n_gpus", n_gpus, args.lines)):
                run[name] = render(args, folder, parsed[:count], settings, out)
                shutil.rmtree(out, ignore_errors=True)
                print(name, run[name], file=sys.stderr)
            run["speedup_steady"] = round(run["n_gpus"]["x_real_time_steady"] / run["one_gpu"]["x_real_time_steady"], 3)
            run["speedup_with_start"] = round(run["n_gpus"]["x_real_time_with_start"] /
                                              run["one_gpu"]["x_real_time_with_start"], 3)
            run["speedup_with_start_same_script"] = same_script(run["one_gpu"], run["n_gpus"])
            report["runs"].append(run)
            save(report, args.json)
        report["complete"] = True
    return emit(report, args.json)


if __name__ == "__main__":
    main()
