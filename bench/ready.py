"""First and second render of a loaded model, with and without the engine made ready at load (MorphTTS.ready).

One process, one workload: load the model, optionally `MorphTTS.ready(width)`, then render the same lines twice
through BatchTTS, each render timed end to end, with the CUDA graphs it captured counted (morph/graphs.capture
calls) and what the process took of the device. With `--triton-cache DIR` Triton's kernel cache is DIR (empty for a
new machine's first load). Lines as bench.batch makes them (bench/lines.py: script, skewed, uniform).

    python -m bench.ready --model /tmp/model-0.6b --device cuda --dtype bf16 --lines 256 --lengths script --width 64
    python -m bench.ready --size tiny --device cpu --lines 4 --width 4               # quick, on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time
from unittest import mock

import torch

from bench.common import HELD_FRAMES, add_model_args, emit, load_bench_model, run_info
from bench.lines import add_line_args, bench_lines
from bench.workload import eos_held, sync, taken_bytes
from morph import graphs
from morph.settings import GenerationSettings


def timed_render(batch, lines, settings, width: int, profile: cProfile.Profile | None = None) -> dict:
    """One render: wall seconds, audio seconds, graphs captured during it, what the process took at its peak (and
    the allocator's new segments); under `profile` too, when given."""
    captured = []
    real = graphs.capture
    device = batch.tts.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        segments = torch.cuda.memory_stats(device).get("segment.all.allocated", 0)
    with mock.patch.object(graphs, "capture", lambda *a, **k: captured.append(1) or real(*a, **k)):
        sync(device)
        start = time.perf_counter()
        with profile or contextlib.nullcontext():
            audio = batch.render(lines, settings, batch_size=width)
            sync(device)
        wall = time.perf_counter() - start
    seconds = sum(len(a) for a in audio) / 24000
    out = dict(wall_s=round(wall, 3), audio_s=round(seconds, 1), x_real_time=round(seconds / wall, 1),
               captures=len(captured))
    if device.type == "cuda":
        out["taken_peak_gib"] = round(taken_bytes(device, peak=True) / 2**30, 3)
        out["new_segments"] = torch.cuda.memory_stats(device).get("segment.all.allocated", 0) - segments
    return out


def slower_first(profiles: list[cProfile.Profile], top: int) -> list[dict]:
    """The functions whose own time grew most from the second render to the first: where the first one's extra goes."""
    first, second = (pstats.Stats(p).stats for p in profiles[:2])
    grown = sorted(first, key=lambda f: first[f][2] - second.get(f, (0, 0, 0))[2], reverse=True)[:top]
    return [dict(function=f"{f[0].rsplit('/', 2)[-1]}:{f[1]} {f[2]}", calls=[first[f][1], second.get(f, (0, 0))[1]],
                 own_s=[round(first[f][2], 4), round(second.get(f, (0, 0, 0))[2], 4)],
                 with_callees_s=[round(first[f][3], 4), round(second.get(f, (0, 0, 0, 0))[3], 4)]) for f in grown]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_line_args(p)
    p.add_argument("--width", type=int, default=64, help="the batch size of the renders and of ready()")
    p.add_argument("--ready-width", type=int, help="the width ready() makes the engine ready for (default --width)")
    p.add_argument("--no-ready", dest="ready", action="store_false", help="load without MorphTTS.ready")
    p.add_argument("--renders", type=int, default=2)
    p.add_argument("--triton-cache", help="Triton's kernel cache folder for this process (TRITON_CACHE_DIR)")
    p.add_argument("--profile", type=int, default=0, metavar="TOP",
                   help="profile the renders (cProfile) and report the TOP functions whose own time grew most from "
                        "the second render to the first")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.triton_cache:
        os.environ["TRITON_CACHE_DIR"] = args.triton_cache  # this benchmark's own process
    start = time.perf_counter()
    tts = load_bench_model(args)
    report = dict(run_info(tts.device), width=args.width, lines=args.lines, lengths=args.lengths,
                  load_s=round(time.perf_counter() - start, 2))
    if args.ready:
        report["ready_width"] = args.ready_width or args.width
        report["ready_s"] = tts.ready(report["ready_width"])
        report["held_gib"] = round(tts.held / 2**30, 3)
    batch, lines, _, frames = bench_lines(tts, args)
    settings = eos_held(GenerationSettings(seed=0, max_new_tokens=frames), frames or HELD_FRAMES)
    profiles = [cProfile.Profile() for _ in range(args.renders)] if args.profile else [None] * args.renders
    report["renders"] = [timed_render(batch, lines, settings, args.width, profile) for profile in profiles]
    if args.profile and args.renders > 1:
        report["slower_first"] = slower_first(profiles, args.profile)
    report["first_over_second"] = round(report["renders"][0]["wall_s"] / report["renders"][1]["wall_s"], 3) \
        if args.renders > 1 else None
    report["from_load_to_first_audio_s"] = round(time.perf_counter() - start - sum(
        r["wall_s"] for r in report["renders"][1:]), 2)
    return emit(report, args.json)


if __name__ == "__main__":
    main()
