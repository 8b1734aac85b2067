"""Batch rendering throughput: many short lines one at a time against batched, in one process.

The same `--lines` lines (about 5 s each: `--frames` frames, EOS held back so random weights
cannot stop early; or, with `--lengths mixed`, a script's spread of lengths, each row ending at its own frame:
bench.common.mixed_texts; x-vector and ICL voices alternating, or one kind) are rendered through
morph/render.py's BatchTTS at every batch size of `--batch-sizes` (1 = one line at a time),
every seq_groups of `--seq-groups` and every mode of `--modes`, measured three ways:
- decode only: `BatchTTS.codes` (prefill and decode of each batch, no codec), as before;
- end to end: `BatchTTS.render`: text in, tokenize, prefill, decode, codec decode, float32 audio out (the first
  run is this configuration's first render in the process);
- script job (each right after a render, `--repeats` of them, as the render batches): what `cli.py render` and
  Render Lines users wait for, `ScriptJob.run` of the same lines into a fresh folder: the render, each line smoothed
  (postprocess.smooth) and written with the manifest, the SRT, and the dialogue joined and written.
Per configuration the JSON reports wall time, aggregate x real time (seconds of audio of all
lines per wall second) and peak memory both ways (allocated, plus what the CUDA graphs held: bench/workload.py), the
weights and what morph/memory.py declares
for the render (on CUDA also its ratio to the end-to-end peak above what the process held before its first render:
the weights, the voices and the cuBLAS workspaces of the caller's stream that making them allocated, none of them
the render's, as a host's memory manager finds them already taken; and, as before, to the peak above the weights
alone), ms per decode step (one step
advances every row of a batch by one frame), the codec decode of all lines alone and its share of the end-to-end
wall, the script job's walls (median, min, max) and files, the mode the loop actually ran and (on the engine) the
frames its step ran at each width; the report starts
with the project commit, device and versions.
Every mode but eager renders on the engine's continuous batch (`--batching continuous`, or `paged`: its keys and
values in a pool of `--kv-cache-gib`), eager in static batches (the exact reference; a row says which ran).
`--agreement` adds how far each seeded line's codes in one batch of the largest batch size agree with the
same line rendered alone (on the engine its own random stream either way: only the batch shape, so the rounding,
differs).

    python -m bench.batch --size tiny --device cpu --lines 4 --frames 8                  # quick, on CPU
    python -m bench.batch --size 0.6b --device cuda --dtype bf16 --lines 256 --lengths mixed --batch-sizes 16,64
    python -m bench.batch --size 0.6b --device cuda --dtype bf16 --json out/batch.json    # random 0.6B dims
    python -m bench.batch --model /tmp/model-0.6b --device cuda --dtype bf16               # weights built already
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import soundfile as sf
import torch

from bench.common import (HELD_FRAMES, add_model_args, emit, load_bench_model, model_dims, ran_batching, run_info,
                          save)
from bench.lines import add_line_args, bench_lines
from bench.workload import StepClock, eos_held, graph_bytes, peak_bytes, sync, taken_bytes
from morph.decode.runner import MODES, check_mode
from morph.lines.script import parse_script
from morph.lines.store import LineStore
from morph.memory import working_memory
from morph.render import BatchTTS, Line, plan_batches
from morph.script_job import ScriptJob, job_context
from morph.settings import FRAMES_PER_SECOND, SAMPLE_RATE, GenerationSettings, runs_lean
from postprocess import smooth

PAUSE_S = 0.4  # between the dialogue's lines: the default of cli.py render and Render Lines
BATCHING = ("continuous", "paged")  # --batching's ways: the engine's pool sized to the rows, or of --kv-cache-gib


def weight_bytes(tts) -> int:
    """The model's parameters and buffers, the codec's included (a plain attribute, not a submodule)."""
    model = tts.tts.model
    modules = [model, model.speech_tokenizer.model]
    return sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])


def run_config(batch: BatchTTS, lines: list[Line], size: int, seq_groups: int, frames: int | None, warm_frames: int,
               repeats: int, mode: str, script_job: bool = True,
               kv_cache_bytes: int | None = None, held_bytes: int = 0, first: bool = False,
               warm_up: bool = False) -> dict:
    """`frames=None`: every row ends at its own frame (batch.stop) or limit (the engine's default for its text);
    kv_cache_bytes: the engine's keys and values in a paged pool of that size (not in eager mode); held_bytes: what
    the process held before its first render (the module docstring says what); first: the end-to-end renders (and
    script jobs) before the decode-only ones, so that the first is the process's first render when this is its only
    configuration; warm_up: one end-to-end render before the timed ones, timed apart (first_render_s)."""
    paged = dict(kv_cache_bytes=kv_cache_bytes) if kv_cache_bytes is not None else {}
    tts = batch.tts
    device = tts.device
    held = frames or HELD_FRAMES
    settings = eos_held(GenerationSettings(seq_groups=seq_groups, seed=0, max_new_tokens=frames), held)
    # static batches as render forms them: longest first
    batches = plan_batches([(settings.frame_limit(line.text.strip()), line.text.strip()) for line in lines], size)
    chunks = [[lines[i] for i in batch] for batch in batches]
    ordered = [line for chunk in chunks for line in chunk]
    tts.patch.mode = check_mode(mode, "bench.batch --modes")
    engine = runs_lean(tts)  # the continuous batch; eager mode runs static batches

    def decode_only():
        with torch.inference_mode():
            # warm-up at this batch size: allocator, kernels, and any CUDA graph for this shape
            warm = eos_held(GenerationSettings(seq_groups=seq_groups, seed=0, max_new_tokens=warm_frames), held)
            start = time.perf_counter()
            batch.codes(chunks[0], warm, batch_size=size, **paged)
            sync(device)
            warm_s = time.perf_counter() - start
            last_run = dict(getattr(tts.patch, "last_run", {}) or {})
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            graphs = graph_bytes(device)  # captured by the warm-up
            walls, codes = [], []
            for _ in range(repeats):
                clock = StepClock()  # the frames' pace at each live-row count (the engine only: static steps all rows)
                sync(device)
                start = time.perf_counter()
                codes = batch.codes(ordered, settings, batch_size=size, **paged, on_step=clock if engine else None)
                sync(device)
                walls.append(time.perf_counter() - start)
            steps = tts.patch.last_run.get("frames_run") if engine else None
            widths = tts.patch.last_run.get("widths") if engine else None  # frames the step ran at each width
            # the engine's pool (render's own size, or kv_cache_bytes) and the rows it preempted
            pages = {k: tts.patch.last_run.get(k) for k in ("pages", "page", "peak_pages", "preemptions")} \
                if engine else {}
            peak = peak_bytes(device) + graphs
            sync(device)
            start = time.perf_counter()
            batch.decode(codes, [line.voice for line in ordered])
            sync(device)
            decode_s = time.perf_counter() - start
        return warm_s, last_run, walls, codes, steps, widths, pages, peak, decode_s, clock.ms_per_frame()

    def end_to_end():  # as a caller of the public API runs it: outside inference mode
        e2e_walls, audio, e2e_peak, jobs, first_s = [], [], 0, [], None
        if warm_up:  # its captures (the codec's, a width's) out of the timed renders, as the peers' benches warm up
            sync(device)
            start = time.perf_counter()
            batch.render(lines, settings, batch_size=size, **paged)
            sync(device)
            first_s = time.perf_counter() - start
        for _ in range(repeats):  # the render, then the script job (what front ends run), in turn
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            start = time.perf_counter()
            audio = batch.render(lines, settings, batch_size=size, **paged)
            sync(device)
            e2e_walls.append(time.perf_counter() - start)
            # what the process took of the device, as morph/memory.py declares it (bench/workload.py taken_bytes)
            e2e_peak = max(e2e_peak, taken_bytes(device, peak=True) if device.type == "cuda" else peak_bytes(device))
            if script_job:  # what the front ends run
                jobs.append(run_script_job(batch, lines, settings, size))
        return e2e_walls, audio, e2e_peak, jobs, first_s

    # asked before the renders, as a host asks: the workspaces the first render takes and keeps are declared until then
    declared = working_memory(tts, [(line.text, line.voice) for line in lines], settings, size)
    ran = {part: part() for part in ((end_to_end, decode_only) if first else (decode_only, end_to_end))}
    warm_s, last_run, walls, codes, steps, widths, pages, peak, decode_s, paced = ran[decode_only]
    e2e_walls, audio, e2e_peak, jobs, first_s = ran[end_to_end]
    wall = float(np.median(walls))
    e2e_wall = float(np.median(e2e_walls))
    e2e_audio_s = sum(a.size for a in audio) / SAMPLE_RATE
    got = [int(c.shape[0]) for c in codes]
    audio_s = sum(got) / FRAMES_PER_SECOND
    if steps is None:  # eager's static batches: each runs to its longest row
        steps = sum(max(int(c.shape[0]) for c in codes[i:i + size]) for i in range(0, len(codes), size))
    weights = weight_bytes(tts)
    row = dict(
        batching="paged" if paged else ran_batching(tts), **pages, batch_size=size, effective_batch=len(chunks[0]), batches=len(chunks), seq_groups=seq_groups,
        ran_as=tts.patch.last_run.get("mode"),
        frames_per_line=[min(got), max(got)], audio_s=round(audio_s, 2), wall_s=round(wall, 3),
        x_real_time=round(audio_s / wall, 2), ms_per_step=round(1000 * wall / steps, 3),
        ms_per_line_frame=round(1000 * wall / sum(got), 3),
        codec_decode_s=round(decode_s, 3), codec_share_of_end_to_end=round(decode_s / e2e_wall, 3),
        peak_memory_gib=round(peak / 2**30, 3), warmup_s=round(warm_s, 2),
        runs_s=[round(w, 3) for w in walls],
        end_to_end_ran_as=tts.patch.last_run.get("mode"), end_to_end_audio_s=round(e2e_audio_s, 2),
        end_to_end_wall_s=round(e2e_wall, 3), end_to_end_x_real_time=round(e2e_audio_s / e2e_wall, 2),
        end_to_end_peak_memory_gib=round(e2e_peak / 2**30, 3), end_to_end_runs_s=[round(w, 3) for w in e2e_walls],
        weights_gib=round(weights / 2**30, 3), declared_memory_gib=round(declared / 2**30, 3),
    )
    if device.type == "cuda":  # what ComfyUI is told (morph/memory.py) against what the render took
        row["end_to_end_peak_above_start_gib"] = round((e2e_peak - held_bytes) / 2**30, 3)
        row["declared_over_measured"] = round(declared / max(e2e_peak - held_bytes, 1), 3)
        row["declared_over_peak_above_weights"] = round(declared / max(e2e_peak - weights, 1), 3)
    if widths:
        row["frames_at_width"] = {str(w): n for w, n in widths.items()}
        row["ms_per_frame_at_live_rows"] = paced  # the last decode-only run's (workload.StepClock)
    if "capture_s" in last_run:
        row["capture_s"] = round(float(last_run["capture_s"]), 3)
    if first_s is not None:
        row["first_render_s"] = round(first_s, 3)
    if jobs:
        walls = [wall for wall, _, _ in jobs]
        job_audio_s = sum(jobs[-1][1]) / SAMPLE_RATE
        row.update(script_job_wall_s=round(float(np.median(walls)), 3),
                   script_job_wall_spread_s=[round(min(walls), 3), round(max(walls), 3)],
                   script_job_runs_s=[round(w, 3) for w in walls], script_job_audio_s=round(job_audio_s, 2),
                   script_job_x_real_time=round(job_audio_s / float(np.median(walls)), 2),
                   script_job_wrote=jobs[-1][2])
    return row


def run_script_job(batch: BatchTTS, lines: list[Line], settings: GenerationSettings, size: int):
    """The same lines as a script job, as `cli.py render` runs one (Render Lines the same, but for the dialogue's
    file): a fresh folder held through its line store, resume checked, each line smoothed (postprocess.smooth) and
    written with the manifest, then the SRT, the dialogue joined and written. Returns the wall seconds from opening
    the store to the dialogue's file, each line's samples, and what was written."""
    tts = batch.tts
    names = ["B" if line.voice.icl else "A" for line in lines]
    spoken = "".join(f"{name}: {line.text}\n" for name, line in zip(names, lines, strict=True))
    parsed = parse_script(spoken, ["A", "B"])
    context = job_context(tts.config, "English", settings, True)
    # ScriptJob renders through a BatchTTS of its own: end each row where this bench's does (a script's own ends)
    with tempfile.TemporaryDirectory(prefix="bench-job-") as folder, \
            mock.patch.object(BatchTTS, "stop", lambda self, row, stop=batch.stop: stop(row)):
        sync(tts.device)
        start = time.perf_counter()
        with LineStore(Path(folder), "bench", "bench.batch") as store:
            job = ScriptJob(parsed, lines, store, context)
            job.reuse()
            result = job.run(lambda todo: tts, settings, size, PAUSE_S,
                             finish_line=functools.partial(smooth, sample_rate=SAMPLE_RATE), who="bench.batch")
            sf.write(str(store.dialogue_path), result.dialogue, SAMPLE_RATE, subtype="FLOAT")
        sync(tts.device)
        wall = time.perf_counter() - start
        wrote = dict(line_files=len(list(store.folder.glob(f"{store.stem}_[0-9]*.wav"))),
                     dialogue=store.dialogue_path.exists(), srt=(store.folder / f"{store.stem}.srt").exists(),
                     manifest=store.manifest_path.exists())
    return wall, [clip.size for clip in result.clips], wrote


def agreement(batch: BatchTTS, lines: list[Line], size: int, seq_groups: int, frames: int | None) -> dict:
    """Each seeded line's codes in one batch of `size` against the line alone, as the mode renders them (eager's
    static batch draws all rows from one random stream): lines identical, the share of each line's frames before its
    first difference (sampling diverges after it), and of codes equal."""
    settings = eos_held(GenerationSettings(seq_groups=seq_groups, seed=0, max_new_tokens=frames), frames or HELD_FRAMES)
    with torch.inference_mode():
        together = batch.codes(lines, settings, batch_size=size)
        alone = [batch.codes([line], settings, batch_size=1)[0] for line in lines]
    before, equal = [], 0
    for a, b in zip(together, alone, strict=True):
        n = min(len(a), len(b))
        codes_equal = a[:n] == b[:n]
        before.append(float(codes_equal.all(dim=1).int().cumprod(0).sum()) / max(len(a), 1))
        equal += int(codes_equal.sum())
    return dict(batch_size=size, seq_groups=seq_groups, lines=len(lines), mode=batch.tts.patch.last_run.get("mode"),
                identical_lines=sum(torch.equal(a, b) for a, b in zip(together, alone, strict=True)),
                share_of_frames_before_first_difference=dict(
                    mean=round(float(np.mean(before)), 4), median=round(float(np.median(before)), 4),
                    min=round(min(before), 4)),
                share_of_codes_equal=round(equal / sum(a.numel() for a in together), 4))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    add_line_args(p)
    p.add_argument("--batch-sizes", default="1,8,16,32", help="comma list; 1 = one line at a time")
    p.add_argument("--seq-groups", default="15,5", help="comma list of seq_groups")
    p.add_argument("--batching", default="continuous",
                   help="comma list: continuous (the engine, its pool sized to the rows; eager mode runs static "
                        "batches), paged (the engine with its keys and values in a pool of --kv-cache-gib; not in "
                        "eager mode)")
    p.add_argument("--kv-cache-gib", type=float, default=4.0, help="the paged pool's size, for --batching paged")
    p.add_argument("--modes", default="auto", help=f"comma list of morph modes, of {', '.join(MODES)}")
    p.add_argument("--warm-frames", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--no-script-job", dest="script_job", action="store_false",
                   help="skip the script job (ScriptJob.run into a folder) after each end-to-end render")
    p.add_argument("--first", action="store_true",
                   help="the end-to-end renders before the decode-only ones: with one configuration, the first is "
                        "the process's first render, as a user's first render after loading the model")
    p.add_argument("--warm-up", action="store_true",
                   help="one end-to-end render before the timed ones, timed apart as first_render_s: every timed "
                        "render warm, as bench/batch_faster.py times its peer")
    p.add_argument("--agreement", action="store_true",
                   help="also: each line's codes in one batch of the largest --batch-sizes against the line alone "
                        "(first mode and seq_groups)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    ways = args.batching.split(",")
    if any(way not in BATCHING for way in ways):  # "static" is retired: eager mode is the static batches
        p.error(f"--batching: a comma list of {', '.join(BATCHING)}, got {args.batching!r}")

    tts = load_bench_model(args)
    batch, lines, ends, frames = bench_lines(tts, args)
    held = taken_bytes(tts.device) if tts.device.type == "cuda" else 0

    results = []
    report = dict(
        run_info(tts.device), dtype=str(tts.tts.model.dtype).replace("torch.", ""), attention=args.attention,
        model=args.model or f"random weights, {args.size} dims", dims=model_dims(tts), lines=args.lines,
        lengths=args.lengths, frames_per_line=frames, held_before_renders_gib=round(held / 2**30, 3),
        script_frames=[min(ends.values()), max(ends.values()), sum(ends.values())] if ends else None,
        seconds_per_line=None if frames is None else round(frames / FRAMES_PER_SECOND, 2), prompts=args.prompts,
        results=results, complete=False,
    )
    for mode in args.modes.split(","):
        for k in (int(x) for x in args.seq_groups.split(",")):
            for size in (int(x) for x in args.batch_sizes.split(",")):
                for way in ways:
                    row = dict(mode=mode)
                    try:
                        kv = int(args.kv_cache_gib * 2**30) if way == "paged" else None
                        row.update(run_config(batch, lines, size, k, frames, args.warm_frames, args.repeats, mode,
                                              args.script_job, kv, held, args.first, args.warm_up))
                    except Exception as e:  # keep the other configurations' numbers
                        row.update(batching=way, batch_size=size, seq_groups=k, error=f"{type(e).__name__}: {e}")
                    results.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    save(report, args.json)

    for row in results:  # speed-up over one line at a time, same mode and seq_groups
        one = next((r for r in results if r.get("batch_size") == 1 and r.get("mode") == row.get("mode")
                    and r.get("seq_groups") == row.get("seq_groups") and r.get("batching") == row.get("batching")
                    and "wall_s" in r), None)
        if one is not None and "wall_s" in row:
            row["speedup_vs_one_at_a_time"] = round(one["wall_s"] / row["wall_s"], 2)
    if args.agreement:
        tts.patch.mode = check_mode(args.modes.split(",")[0], "bench.batch --modes")
        report["agreement"] = agreement(batch, lines, max(int(x) for x in args.batch_sizes.split(",")),
                                        int(args.seq_groups.split(",")[0]), frames)
        print(json.dumps(report["agreement"]), file=sys.stderr, flush=True)
    report["complete"] = True
    return emit(report, args.json)


if __name__ == "__main__":
    main()
