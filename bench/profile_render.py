"""Where a batch render's time goes on one GPU: a profile, so that a missed target names what bounds it.

For each batch size of `--batch-sizes` (one batch of that many lines, bench.batch's lines and voices, EOS held
back at `--frames`), after a warm render:
- the render end to end, and the same with a device sync around each part, so each is charged its own GPU time:
  prompt inputs (host), upstream's generate around the loop, the talker prefill, the frame loop (with the lean
  codec's chunks beside it, which the syncs serialise), the rest;
- the codec alone on the batch's codes: the lean codec (what the render runs) and upstream's, each timed, and each
  bf16 decode's error against upstream's in fp32 (RMS over RMS);
- kernels: the GPU kernels of the frame loop per frame (two runs of different length, differenced, so the
  prefill cancels) and of the lean codec's decode of the batch, grouped by name, the top ones with their share.

    python -m bench.profile_render --size tiny --device cpu --batch-sizes 2 --frames 8       # quick, on CPU
    python -m bench.profile_render --size 0.6b --device cuda --dtype bf16 --batch-sizes 32,128 --json out/p.json
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import torch

from bench.lines import script
from bench.common import add_model_args, emit, load_bench_model, run_info
from bench.sentences import reference_wave
from bench.workload import REF_TEXT, eos_held, sync, timed_calls
from morph import render
from morph.reference import loop as reference
from morph.render import BatchTTS, Line
from morph.settings import FRAMES_PER_SECOND, GenerationSettings


def phases(tts, device):
    """Wraps the render's parts with syncs (workload.timed_calls); yields the dict of seconds per part they fill."""
    return timed_calls([(render, "prompt_inputs", "prompt_inputs"), (tts.tts.model, "generate", "generate"),
                        (reference, "prefill", "prefill"), (reference, "decode", "frame_loop")],
                       around=lambda: sync(device))


def kernel_table(run, top: int) -> tuple[dict, float, int]:
    """(microseconds per kernel name, total, kernel count) of the GPU kernels `run()` launches."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    times, count = collections.Counter(), 0
    for e in prof.events():
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue
        if e.name.lower().startswith(("memcpy", "memset", "[memory]")):
            continue
        times[e.name] += e.time_range.elapsed_us()
        count += 1
    return times, sum(times.values()), count


def top_rows(times: dict, total: float, scale: float, top: int) -> list[dict]:
    return [dict(name=name[:100], us=round(us * scale, 1), share=round(us / max(total, 1e-9), 3))
            for name, us in sorted(times.items(), key=lambda kv: -kv[1])[:top]]


def profile_batch(tts, lines: list[Line], frames: int, top: int) -> dict:
    device = tts.device
    batch = BatchTTS(tts)
    size = len(lines)
    settings = eos_held(GenerationSettings(seed=0, max_new_tokens=frames), frames)
    audio_s = size * (frames - 1) / FRAMES_PER_SECOND
    batch.render(lines, settings, batch_size=size)  # warm: kernels, graphs, allocator
    sync(device)
    start = time.perf_counter()
    batch.render(lines, settings, batch_size=size)
    sync(device)
    wall = time.perf_counter() - start
    with phases(tts, device) as spent:
        start = time.perf_counter()
        batch.render(lines, settings, batch_size=size)
        synced = time.perf_counter() - start
    row = dict(batch_size=size, frames=frames, audio_s=round(audio_s, 2), render_s=round(wall, 4),
               x_real_time=round(audio_s / wall, 1), synced_render_s=round(synced, 4),
               phases_s={k: round(v, 4) for k, v in spent.items()})
    row["phases_s"]["generate_outside_loop"] = round(spent["generate"] - spent["prefill"] - spent["frame_loop"], 4)
    row["phases_s"]["rest"] = round(synced - spent["generate"] - spent["prompt_inputs"], 4)
    row["frame_loop_ms_per_frame"] = round(1000 * spent["frame_loop"] / (frames - 1), 3)
    if device.type != "cuda":
        return row
    codes = batch.codes(lines, settings, batch_size=size)
    short = eos_held(GenerationSettings(seed=0, max_new_tokens=frames // 2), frames)
    runs = [kernel_table(lambda s=s: batch.codes(lines, s, batch_size=size), top) for s in (short, settings)]
    n = frames - frames // 2
    diff = {k: runs[1][0][k] - runs[0][0].get(k, 0) for k in runs[1][0]}
    total = sum(diff.values())
    row["frame_kernels"] = dict(kernels_per_frame=round((runs[1][2] - runs[0][2]) / n, 1),
                                gpu_us_per_frame=round(total / n, 1), top=top_rows(diff, total, 1 / n, top))
    voices = [line.voice for line in lines]
    refs = [v.ref_code for v in voices]
    tok = tts.tts.model.speech_tokenizer
    lean = batch.decode(codes, voices)
    up = render.decode_rows(tok, codes, refs)
    row["codec_s"] = {}
    for name, run in (("lean", lambda: batch.decode(codes, voices)),
                      ("upstream", lambda: render.decode_rows(tok, codes, refs))):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        row["codec_s"][name] = round(time.perf_counter() - start, 4)
    dtype = next(tok.model.parameters()).dtype
    tok.model.float()
    exact = render.decode_rows(tok, codes, refs)
    tok.model.to(dtype)
    rms = float(np.sqrt(np.mean(np.concatenate(exact) ** 2)))
    row["codec_error_vs_fp32"] = {
        name: round(float(np.sqrt(np.mean(np.concatenate(
            [a - b for a, b in zip(got, exact, strict=True)]) ** 2))) / rms, 5)
        for name, got in (("lean", lean), ("upstream", up))}
    times, total, count = kernel_table(lambda: batch.decode(codes, voices), top)
    row["codec_kernels"] = dict(kernels=count, gpu_ms=round(total / 1000, 2), top=top_rows(times, total, 1, top))
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--batch-sizes", default="32,128")
    p.add_argument("--frames", type=int, default=62)
    p.add_argument("--prompts", default="mixed", choices=["mixed", "xvector", "icl"])
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args(argv)
    tts = load_bench_model(args)
    voices = {"xvector": tts.make_voice(reference_wave(), 24000),
              "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}
    kinds = ["xvector", "icl"] if args.prompts == "mixed" else [args.prompts]
    report = dict(run_info(tts.device), prompts=args.prompts, results=[])
    for size in (int(x) for x in args.batch_sizes.split(",")):
        lines = [Line(t, voices[kinds[i % len(kinds)]], "English") for i, t in enumerate(script(size))]
        report["results"].append(profile_batch(tts, lines, args.frames, args.top))
    return emit(report, args.json)


if __name__ == "__main__":
    main()
