"""Where a render's memory goes on one GPU: what the process holds between two renders and what is live at the next
render's peak, each grouped by where it was allocated (the innermost frame in the project), beside what
morph/memory.py declares. Its first form, a probe quoted in bench/results/h200-2026-11-26d/NOTES.md, named what
bounds issue 35's memory target.

bench.batch's lines and voices (`--lines`, `--lengths`, `--frames`, `--prompts`), one batch size, on the engine
(the GPU's default mode): a warm render of 8 frames in inference mode, a first render of the lines (outside it, as the
public API is called), then what is held; then every allocation of one more render (torch's memory history),
replayed for its peak.
Torch records that history under its native allocator only: run it with PYTORCH_CUDA_ALLOC_CONF unset (ComfyUI's
`--disable-cuda-malloc`); the sizes are the allocations' own, whichever allocator runs them.

    python -m bench.memory_map --size 0.6b --device cuda --dtype bf16 --lines 256 --lengths script --batch-size 64
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
from pathlib import Path

import torch

from bench.batch import weight_bytes
from bench.common import HELD_FRAMES, add_model_args, emit, load_bench_model, ran_batching, run_info
from bench.lines import add_line_args, bench_lines
from bench.workload import eos_held
from morph.memory import working_memory
from morph.settings import GenerationSettings

ROOT = str(Path(__file__).resolve().parents[1])
MiB = 2**20


def site(frames: list[dict], root: str = ROOT, depth: int = 1) -> str:
    """Where a block was allocated: its `depth` innermost frames in the project (`file:line function`, innermost
    first), else the innermost frame outside it."""
    mine = [f for f in frames if f.get("filename", "").startswith(root + os.sep)]
    if not mine:
        return "outside: " + (f"{Path(frames[0]['filename']).name}:{frames[0].get('line')}" if frames else "?")
    return " < ".join(f"{f['filename'][len(root) + 1:]}:{f.get('line')} {f.get('name')}" for f in mine[:depth])


def held(segments: list[dict], root: str = ROOT, depth: int = 1) -> collections.Counter:
    """Bytes of the live blocks of a memory snapshot's segments, by site."""
    out: collections.Counter = collections.Counter()
    for segment in segments:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                out[site(block.get("frames", []), root, depth)] += block["size"]
    return out


def peak(trace: list[dict], root: str = ROOT, depth: int = 1) -> tuple[int, collections.Counter]:
    """(the most bytes the trace's allocations held at once, above what was live when it began; those live then by
    site): a memory history's device trace replayed, a block held from its alloc to its free_completed."""
    live: dict[int, tuple[int, list]] = {}
    total, top, at_top = 0, 0, {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
            total += event["size"]
            if total > top:
                top, at_top = total, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    out: collections.Counter = collections.Counter()
    for size, frames in at_top.values():
        out[site(frames, root, depth)] += size
    return top, out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    add_line_args(p)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--depth", type=int, default=2, help="frames of a site: 1 names the allocating line alone")
    p.add_argument("--top", type=int, default=25, help="sites listed in each table")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench.memory_map: torch's memory history is the CUDA allocator's: run it on an NVIDIA GPU")
    if "cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        sys.exit("bench.memory_map: torch records its memory history under the native allocator only: run it with "
                 "PYTORCH_CUDA_ALLOC_CONF unset")
    torch.cuda.memory._record_memory_history(enabled="state", stacks="python")  # each block's site, no trace yet
    tts = load_bench_model(args)
    batch, lines, _, frames = bench_lines(tts, args)
    size = args.batch_size
    settings = eos_held(GenerationSettings(seq_groups=5, seed=0, max_new_tokens=frames), frames or HELD_FRAMES)
    weights = weight_bytes(tts)

    def table(counts: collections.Counter) -> dict:
        return {k: round(v / MiB, 1) for k, v in counts.most_common(args.top)}

    with torch.inference_mode():  # as bench.batch warms up
        batch.codes(lines[:size], dataclasses.replace(settings, max_new_tokens=8), batch_size=size)
    batch.render(lines, settings, batch_size=size)
    torch.cuda.synchronize()
    between = torch.cuda.memory_allocated()
    kept = held(torch.cuda.memory._snapshot()["segments"], depth=args.depth)
    torch.cuda.memory._record_memory_history(None)  # a trace of this render's allocations alone
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=4_000_000)
    batch.render(lines, settings, batch_size=size)
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][tts.device.index or 0]
    torch.cuda.memory._record_memory_history(None)
    top, at_top = peak(trace, depth=args.depth)
    declared = working_memory(tts, [(line.text, line.voice) for line in lines], settings, size)
    report = dict(
        run_info(tts.device), lines=args.lines, lengths=args.lengths, batch_size=size, batching=ran_batching(tts),
        ran_as=tts.patch.last_run.get("mode"), weights_gib=round(weights / 2**30, 3),
        declared_gib=round(declared / 2**30, 3),
        held_between_renders_above_weights_gib=round((between - weights) / 2**30, 3),
        peak_above_weights_gib=round((between + top - weights) / 2**30, 3),
        trace_events=len(trace), trace_full=len(trace) >= 4_000_000,
        held_between_renders_mib=table(kept), made_in_the_render_and_live_at_its_peak_mib=table(at_top),
    )
    return emit(report, args.json)


if __name__ == "__main__":
    main()
