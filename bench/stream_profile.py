"""Where a render's GPU time goes, stream by stream: the frame loop's and the codec's, which share one GPU.

Renders bench.batch's lines (`--lines`, `--lengths`) twice to warm up, then once under torch's profiler, and reports
for each CUDA stream its kernels, their summed time, the time it was busy (overlapping kernels counted once) and its
top kernels by time; and the time any stream was busy. A stream busy for most of the render bounds it; two
streams whose busy times add up to the union ran one after the other.

    python -m bench.stream_profile --model /tmp/model-0.6b --device cuda --dtype bf16 --lines 256 --lengths script \\
        --batch-size 64 --json out/profile.json          # --mode eager for its static batches
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time

from bench.common import HELD_FRAMES, add_model_args, emit, load_bench_model, ran_batching, run_info
from bench.lines import add_line_args, bench_lines
from bench.workload import eos_held, sync
from morph.decode.runner import MODES, check_mode
from morph.settings import GenerationSettings

GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def busy_us(spans: list[tuple[float, float]]) -> float:
    """Microseconds covered by (start, end) spans, overlaps counted once."""
    total, start, end = 0.0, None, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += 0.0 if end is None else end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (0.0 if end is None else end - start)


def stream_table(events: list[dict], top: int = 20) -> dict:
    """A chrome trace's GPU events -> per stream (kernels, sum_ms, busy_ms, top [name, ms, count]) and busy_ms for
    all of them together."""
    gpu = [e for e in events if e.get("cat") in GPU_EVENTS and "dur" in e]
    by_stream = collections.defaultdict(list)
    for e in gpu:
        by_stream[str(e.get("args", {}).get("stream", e.get("tid")))].append(e)
    streams = {}
    for stream, evs in sorted(by_stream.items()):
        time_by, count_by = collections.Counter(), collections.Counter()
        for e in evs:
            time_by[e["name"][:100]] += e["dur"]
            count_by[e["name"][:100]] += 1
        streams[stream] = dict(kernels=len(evs), sum_ms=round(sum(e["dur"] for e in evs) / 1e3, 1),
                               busy_ms=round(busy_us([(e["ts"], e["ts"] + e["dur"]) for e in evs]) / 1e3, 1),
                               top=[[n, round(t / 1e3, 1), count_by[n]] for n, t in time_by.most_common(top)])
    return dict(streams=streams, busy_ms=round(busy_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu]) / 1e3, 1))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    add_line_args(p)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--mode", default="auto",
                   help=f"the morph mode, of {', '.join(MODES)} (eager renders in static batches, the rest on the "
                        "engine)")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)

    from torch.profiler import ProfilerActivity, profile

    tts = load_bench_model(args)
    tts.patch.mode = check_mode(args.mode, "bench.stream_profile --mode")
    batch, lines, _, frames = bench_lines(tts, args)
    device = tts.device
    settings = eos_held(GenerationSettings(seq_groups=5, seed=0, max_new_tokens=frames), frames or HELD_FRAMES)
    walls = []

    def render():
        sync(device)
        start = time.perf_counter()
        batch.render(lines, settings, batch_size=args.batch_size)
        sync(device)
        walls.append(round(time.perf_counter() - start, 3))

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    render()
    render()
    with profile(activities=activities) as prof:
        render()
    with tempfile.TemporaryDirectory() as folder:
        trace = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            table = stream_table(json.load(f)["traceEvents"], args.top)
    report = dict(run_info(device), lines=args.lines, lengths=args.lengths, batch_size=args.batch_size,
                  batching=ran_batching(tts), walls_s=walls[:2], profiled_wall_s=walls[2],
                  **table)
    return emit(report, args.json)


if __name__ == "__main__":
    main()
