"""Time to first audio of one line: streamed (MorphTTS.stream) against spoken whole (MorphTTS.clone), in one process.

Each of `--lines` lines (a realistic script's, bench.common.script_lines: 1 to 15 s, each ending at its own frame,
EOS held back until then so random weights cannot stop early) is spoken both ways in turn, streamed first, through
the public API as a caller runs it: text in, audio out. Per way the report holds the time to the first audio (for
clone, its whole line), the wall time and the seconds of audio; for the stream also the first chunk's seconds of
audio and the number of chunks. The first line is each way's first call in the process (its captures included, as
a user's first request pays them) and is reported apart (`first_call`); the rest give p50, p95 and max. Alone, one
line at a time: what a voice agent's single request waits for, not a server's load (that is bench/serve.py's, to
come with issue 36). `--frames 1` holds every line to one frame: a warm clone of one frame, the floor of first audio
(issue 35's target: at most 20 ms), whatever the line's text. `--parts` then speaks every line whole once more with
the engine's parts (PARTS) timed on the host, each part's wall time summed (a part inside another counts in both),
and reports their milliseconds a line apart from the timings above, which the timing would slow.

    python -m bench.stream --size tiny --device cpu --lines 3 --mode lean              # quick, on CPU
    python -m bench.stream --size 0.6b --device cuda --dtype bf16 --lines 20 --json out/stream.json
    python -m bench.stream --size 0.6b --device cuda --dtype bf16 --lines 16 --frames 1 --json out/clone1.json
    python -m bench.stream --size 0.6b --device cuda --dtype bf16 --lines 16 --frames 1 --parts --json out/parts.json
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import numpy as np

from bench.common import add_model_args, emit, load_bench_model, model_dims, run_info, save, script_lines
from bench.sentences import reference_wave
from bench.workload import REF_TEXT, eos_held, sync, timed_calls
from morph.decode.runner import check_mode
from morph.settings import SAMPLE_RATE, GenerationSettings


# Where a warm line's host time goes (--parts): the render, the prompt built by upstream's generate, the batch's setup
# and the weights' fingerprint in it, a join with its prompt writes and prefill, the wait for a row's end, the live
# codec's calls. Measured on 2026-11-27: bench/results/h100-2026-11-27b/NOTES.md.
PARTS = (("morph.render", "BatchTTS.render"), ("morph.engine.runner", "RowRunner._group"),
         ("morph.engine.batch", "ContinuousBatch.__init__"), ("morph.decode.talker_loop", "TalkerLoop.owner"),
         ("morph.engine.batch", "ContinuousBatch._join"), ("morph.decode.kv_store", "PagedKV.write_prompt"),
         ("morph.decode.prefill_graphs", "PrefillGraphs.prefill"), ("morph.engine.batch", "ContinuousBatch._settle"),
         ("morph.codec.stream", "CodecStream.open"), ("morph.codec.stream", "CodecStream.feed"),
         ("morph.codec.stream", "CodecStream.pump"))


def timed_parts():
    """PARTS wrapped to time their calls (workload.timed_calls): yields the seconds spent in each, by name."""
    targets = []
    for module, name in PARTS:
        owner, attr = name.split(".")
        targets.append((getattr(importlib.import_module(module), owner), attr, name))
    return timed_calls(targets)


def speak(tts, text: str, voice, frames: int, seq_groups: int, streamed: bool) -> dict:
    """One line one way: seconds to the first audio, wall seconds, seconds of audio (and chunks, streamed)."""
    settings = eos_held(GenerationSettings(seq_groups=seq_groups, seed=0, max_new_tokens=frames), frames)
    sync(tts.device)
    start = time.perf_counter()
    if streamed:
        chunks, first = [], None
        for chunk in tts.stream(text, voice, "English", settings):
            if first is None:
                first = time.perf_counter() - start
            chunks.append(chunk)
        audio = np.concatenate(chunks)
    else:
        audio = tts.clone(text, voice, "English", settings)
    sync(tts.device)
    wall = time.perf_counter() - start
    row = dict(first_audio_s=round(wall if not streamed else first, 4), wall_s=round(wall, 4),
               audio_s=round(audio.size / SAMPLE_RATE, 3))
    if streamed:
        row.update(chunks=len(chunks), first_chunk_audio_s=round(chunks[0].size / SAMPLE_RATE, 3))
    row["ran_as"] = tts.patch.last_run.get("mode")  # the mode the loop ran (auto resolved, or a fallback)
    return row


def summary(rows: list[dict]) -> dict:
    """p50, p95 and max of the first audio and the wall, and the x real time of all the lines together."""
    first, wall = np.array([r["first_audio_s"] for r in rows]), np.array([r["wall_s"] for r in rows])
    out = dict(lines=len(rows), first_audio_p50_s=round(float(np.median(first)), 4),
               first_audio_p95_s=round(float(np.percentile(first, 95)), 4), first_audio_max_s=round(float(first.max()), 4),
               wall_p50_s=round(float(np.median(wall)), 4),
               x_real_time=round(sum(r["audio_s"] for r in rows) / float(wall.sum()), 2))
    if "chunks" in rows[0]:
        out["first_chunk_audio_p50_s"] = round(float(np.median([r["first_chunk_audio_s"] for r in rows])), 3)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--lines", type=int, default=20, help="lines of the realistic script, each spoken both ways")
    p.add_argument("--mode", default="auto", help="the speed mode (morph.settings.MODES); eager streams nothing")
    p.add_argument("--seq-groups", type=int, default=5)
    p.add_argument("--frames", type=int, default=0,
                   help="hold every line to this many frames instead of where its own speech ends (1: a warm clone "
                        "of one frame, the floor of first audio)")
    p.add_argument("--parts", action="store_true",
                   help="then speak every line whole once more with the engine's parts timed on the host (PARTS)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if args.lines < 2:
        p.error("--lines must be at least 2: the first line is the first call, reported apart")
    if args.frames < 0:
        p.error("--frames must be 0 (each line's own) or more")
    tts = load_bench_model(args)
    tts.patch.mode = check_mode(args.mode, "bench.stream --mode")
    voice = tts.make_voice(reference_wave(), 24000, transcript=REF_TEXT)
    report = dict(run_info(tts.device), dims=model_dims(tts), dtype=str(tts.tts.model.dtype), mode=args.mode,
                  seq_groups=args.seq_groups, lines=args.lines, held_frames=args.frames or None, complete=False)
    ways = {"stream": [], "clone": []}
    for i, (text, own) in enumerate(script_lines(args.lines)):
        frames = args.frames or own
        for way, rows in ways.items():
            rows.append(dict(speak(tts, text, voice, frames, args.seq_groups, way == "stream"), frames=frames))
        report["runs"] = ways
        save(report, args.json)
        print(f"line {i + 1}/{args.lines}: {frames} frames, first audio streamed "
              f"{ways['stream'][-1]['first_audio_s']:.3f} s, whole {ways['clone'][-1]['first_audio_s']:.3f} s",
              file=sys.stderr)
    for way, rows in ways.items():
        report[way] = dict(first_call=rows[0], **summary(rows[1:]))
    if args.parts:
        lines = script_lines(args.lines)[1:]  # warm: the first line's captures are behind
        with timed_parts() as spent:
            for text, own in lines:
                speak(tts, text, voice, args.frames or own, args.seq_groups, False)
        report["host_parts_ms_a_line"] = {name: round(spent[name] / len(lines) * 1e3, 3) for _, name in PARTS}
    report["complete"] = True
    return emit(report, args.json)


if __name__ == "__main__":
    main()
