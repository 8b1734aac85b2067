"""Side-by-side speed of one line: upstream qwen-tts against the morph stacks, in one process.

Every stack speaks the same text with the same voice for the same fixed number of frames (EOS is held back, so
random weights cannot stop early), measured two ways under the same conditions:
- end to end: what a user waits for, through the public API (MorphTTS.clone; upstream's generate_voice_clone):
  text in, tokenize, prefill, decode, codec decode, audio out;
- decode only: the line's codes, no codec: upstream's generate on prepared inputs (prefill plus decode), or a morph
  stack's as a render decodes them (BatchTTS.codes: prompt, prefill and decode, on the engine in every mode but
  eager, in eager upstream's generate with the morph loop).
Both run as a caller of the public API runs them (each library's own grad mode), taken in turn, end to end first:
E D E D E D for `--repeats` 3, so both see the same warm state and the same drift of the machine. The first end-to-
end run is the stack's first call in this process (its graph capture and its codec's first shapes included, as a
user's first line pays them); `end_to_end_ms_per_frame` is the median of every end-to-end run, that first one
included, `ms_per_frame` the median of the decode-only runs, each with its min and max (`*_spread`). `--warm-up`
makes a morph stack's first call before its timed runs instead (`first_call_s`), so that every timed run is warm,
as bench/speed_faster.py times its peer; upstream captures nothing, so its first timed run stays its first call.
Then the codec this stack runs, alone on the line's codes, `--repeats` times (`codec`, `codec_decode_ms_per_frame`):
upstream's speech tokenizer for upstream (as its generate_voice_clone decodes), BatchTTS.decode for a morph mode
(the lean codec, morph/codec/layers.py, in every mode but eager; upstream's decoder in pieces in eager).
The JSON printed at the end (and written to --json) holds the project commit, device, torch and transformers
versions, model dims, and per stack and prompt: ms per frame and x real time both ways, peak allocated memory both
ways, capture/compile seconds, the first call's wall time, the mode the loop actually ran, and GPU kernels per
frame (--profile). It can also hold the bf16 agreement with upstream under greedy decoding (--agreement).

Stacks: "upstream" (qwen-tts generate) and MODE:K, MODE one of morph.settings.MODES.

`--first-call MODES` measures instead what the first line costs a fresh process: per mode, two
new processes (`--one-call`) that load the model and speak one line, the first with empty
Triton and Inductor caches in a new temporary folder, the second reusing them.

    python -m bench.speed --size tiny --device cpu --frames 40 --stacks upstream,eager:15,eager:5
    python -m bench.speed --size 0.6b --device cuda --dtype bf16 --json out/speed.json   # random 0.6B dims
    python -m bench.speed --model /path/to/Qwen3-TTS-12Hz-0.6B-Base                      # a real checkpoint
    python -m bench.speed --model DIR --device cuda --dtype bf16 --first-call auto,graphs --json out/first.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from bench.common import DTYPES, add_model_args, emit, load_bench_model, model_dims, run_info, save
from bench.kernel_count import count_kernels, stop_after
from bench.random_model import build_random_model
from bench.stacks import Runner, stack
from bench.sentences import reference_wave
from bench.workload import REF_TEXT, TEXT, eos_held, peak_bytes, sync
from morph.decode.runner import check_mode
from morph.api import MorphTTS
from morph.qwen.loading import resolve_device
from morph.render import BatchTTS
from morph.settings import DEFAULT_SEQ_GROUPS, FRAMES_PER_SECOND, MODES, SAMPLE_RATE, GenerationSettings, runs_lean

# Every mode the engine has, at the exact setting and the default one.
DEFAULT_STACKS = ",".join(["upstream"] + [f"{mode}:{k}" for mode in MODES for k in (15, DEFAULT_SEQ_GROUPS)])
SAMPLES_PER_FRAME = int(SAMPLE_RATE / FRAMES_PER_SECOND)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `python -m bench.speed` runs


def _once(device: torch.device, run) -> tuple[float, int, object]:
    """Wall seconds of one run, the peak memory during it (allocated on CUDA; the process's peak RSS on a CPU),
    and its result."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    start = time.perf_counter()
    out = run()
    sync(device)
    return time.perf_counter() - start, peak_bytes(device), out


def spread(seconds: list[float], frames: int) -> tuple[float, list[float]]:
    """Milliseconds per frame of some runs: the median, and [min, max]."""
    ms = [1000 * s / frames for s in seconds]
    return round(float(np.median(ms)), 3), [round(min(ms), 3), round(max(ms), 3)]


def stack_codec(tts: MorphTTS, runner: Runner, spec: str, codes: torch.Tensor):
    """The codec this stack runs on a line, as (its name, a call that decodes `codes` with it)."""
    ref = runner.voice.ref_code
    if spec.startswith("upstream"):  # as generate_voice_clone decodes: the reference's codes in front, one call
        full = codes if ref is None else torch.cat([ref.to(codes.device), codes])
        return "upstream speech tokenizer", lambda: tts.tts.model.speech_tokenizer.decode([{"audio_codes": full}])
    batch = BatchTTS(tts)
    name = "lean codec (morph/codec)" if runs_lean(tts) else "upstream decoder in pieces (morph/codec/pieces.py)"
    return name, lambda: batch.decode([codes], [runner.voice])


def time_stack(tts: MorphTTS, runner: Runner, spec: str, frames: int, repeats: int, profile: bool,
               warm_up: bool = False) -> dict:
    """One stack on one prompt: end to end (runner.speak) and decode only (runner.generate) in
    turn, `repeats` times each, end to end first; then the stack's codec alone on the last decode-only codes.
    warm_up: a morph stack's first call is made before the timed runs, untimed but for first_call_s."""
    device = tts.device
    upstream = spec.startswith("upstream")
    seq_groups = 15 if upstream else int(spec.split(":")[1])
    warm_up = warm_up and not upstream
    row, e2e, decode, e2e_peak, peak = {}, [], [], 0, 0

    def first_call_made():  # the stack's first call: its capture (or compile) is in it
        row["capture_or_compile_s"] = tts.patch.last_run.get("capture_s", 0.0)
        row["end_to_end_ran_as"] = tts.patch.last_run.get("mode")

    with stack(tts, spec):
        if warm_up:
            row["first_call_s"] = round(_once(device, lambda: runner.speak(frames, seq_groups, upstream))[0], 3)
            first_call_made()
        for i in range(repeats):
            seconds, used, audio = _once(device, lambda: runner.speak(frames, seq_groups, upstream))
            e2e.append(seconds)
            e2e_peak = max(e2e_peak, used)
            if i == 0 and not upstream and not warm_up:
                first_call_made()
            seconds, used, codes = _once(device, lambda: runner.generate(frames, upstream))
            decode.append(seconds)
            peak = max(peak, used)
        if not upstream:
            row["ran_as"] = tts.patch.last_run.get("mode")
        row["codec"], run_codec = stack_codec(tts, runner, spec, codes)
        codec = [_once(device, run_codec)[0] for _ in range(repeats)]
        if profile and device.type == "cuda":
            def run_frames(n):
                with stop_after(tts, n, upstream) as on_step, torch.inference_mode():
                    runner.generate(frames, upstream, on_step=on_step)
            a, b = (2, 6) if upstream else (4, 24)
            row.update(count_kernels(run_frames, a, b))
    got = int(codes.shape[0])
    e2e_frames = round(audio.size / SAMPLES_PER_FRAME)
    ms, ms_spread = spread(decode, got)
    e2e_ms, e2e_spread = spread(e2e, e2e_frames)
    codec_ms, codec_spread = spread(codec, got)
    row.setdefault("first_call_s", round(e2e[0], 3))
    warm = e2e if warm_up else e2e[1:]
    row.update(frames=got, warmed_up=warm_up, ms_per_frame=ms, ms_per_frame_spread=ms_spread,
               x_real_time=round(1000 / FRAMES_PER_SECOND / ms, 2), peak_memory_gib=round(peak / 2**30, 3),
               runs_s=[round(t, 3) for t in decode],
               end_to_end_frames=e2e_frames, end_to_end_ms_per_frame=e2e_ms, end_to_end_ms_per_frame_spread=e2e_spread,
               end_to_end_warm_ms_per_frame=spread(warm, e2e_frames)[0] if warm else None,
               end_to_end_x_real_time=round(1000 / FRAMES_PER_SECOND / e2e_ms, 2),
               end_to_end_peak_memory_gib=round(e2e_peak / 2**30, 3), end_to_end_runs_s=[round(t, 3) for t in e2e],
               codec_decode_ms_per_frame=codec_ms, codec_decode_ms_per_frame_spread=codec_spread)
    return row


def greedy_agreement(tts: MorphTTS, runner: Runner, frames: int, specs: list[str]) -> dict:
    """Fraction of frames whose 16 codes equal upstream's, greedy, seq_groups=15."""
    out = {}

    def codes(spec):
        with stack(tts, spec), torch.inference_mode():
            return runner.generate(frames, spec.startswith("upstream"), greedy=True).cpu()

    ref = codes("upstream")
    for spec in specs:
        got = codes(spec)
        n = min(len(ref), len(got))
        same = (ref[:n] == got[:n]).all(dim=1)
        diverge = int((~same).int().argmax()) if not bool(same.all()) else n
        out[spec] = dict(frames=n, fraction_equal=round(float(same.float().mean()), 4), first_divergence=diverge,
                         code0_fraction_equal=round(float((ref[:n, 0] == got[:n, 0]).float().mean()), 4))
    return out


def stack_name(spec: str) -> str:
    if spec == "upstream":
        return "upstream qwen-tts"
    mode, k = spec.split(":")
    return f"morph {mode} k={k}"


def one_call(args) -> dict:
    """In a fresh process (spawned by first_call): load the model, make a voice and speak one line, as a user's
    first call does, timing each step. `since_spawn_s`: from the parent's spawn to here (interpreter start and
    imports); `cache_files_at_start`: files already in the Triton and Inductor caches (0 when cold)."""
    since_spawn = time.time() - args.spawned_at
    cached = sum(len(files) for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR") if os.environ.get(var)
                 for _, _, files in os.walk(os.environ[var]))
    start = time.perf_counter()
    tts = MorphTTS.load(args.model, args.device, args.dtype, args.attention, mode=args.one_call)
    sync(tts.device)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    prompt = args.prompts.split(",")[0]
    voice = tts.make_voice(reference_wave(), SAMPLE_RATE, REF_TEXT if prompt == "icl" else None)
    voice_s = time.perf_counter() - start
    settings = eos_held(GenerationSettings(seq_groups=args.first_call_seq_groups, seed=0, max_new_tokens=args.frames),
                        args.frames)
    if tts.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(tts.device)
    start = time.perf_counter()
    audio = tts.clone(TEXT, voice, "English", settings)
    sync(tts.device)
    first_s = time.perf_counter() - start
    run = tts.patch.last_run
    return dict(mode=args.one_call, ran_as=run.get("mode"), seq_groups=settings.seq_groups, prompt=prompt,
                cache_files_at_start=cached, since_spawn_s=round(since_spawn, 2), load_s=round(load_s, 2),
                voice_s=round(voice_s, 2), first_generation_s=round(first_s, 2),
                capture_or_compile_s=run.get("capture_s"), frames=round(audio.size / SAMPLES_PER_FRAME),
                peak_memory_gib=round(peak_bytes(tts.device) / 2**30, 3))


def first_call(args, model: str) -> list[dict]:
    """Per mode: a process with empty Triton and Inductor caches (a new temporary folder), then a second one
    reusing them. Each row: the child's own timings (one_call), and the whole process's wall time."""
    rows = []
    for mode in (m for m in args.first_call.split(",") if m):
        check_mode(mode, "bench.speed --first-call")
        with tempfile.TemporaryDirectory(prefix="bench-first-call-") as caches:
            env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(caches, "triton"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"))
            for cache in ("cold", "warm"):
                command = [sys.executable, "-m", "bench.speed", "--one-call", mode, "--model", model,
                           "--device", args.device, "--dtype", args.dtype, "--attention", args.attention,
                           "--frames", str(args.frames), "--prompts", args.prompts,
                           "--first-call-seq-groups", str(args.first_call_seq_groups),
                           "--spawned-at", str(time.time())]
                row = dict(mode=mode, caches=cache)
                start = time.perf_counter()
                try:
                    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT,
                                          timeout=args.first_call_timeout)
                except subprocess.TimeoutExpired:
                    row["error"] = f"timed out after {args.first_call_timeout} s"
                else:
                    lines = done.stdout.strip().splitlines()
                    if done.returncode == 0 and lines:
                        row.update(json.loads(lines[-1]))
                    else:
                        row["error"] = f"exit {done.returncode}: {done.stderr.strip()[-2000:]}"
                row["process_s"] = round(time.perf_counter() - start, 2)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--build-into", help="build the random model into this folder and keep it (for speed_faster)")
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--repeats", type=int, default=3, help="runs of each stack end to end (its first call included), "
                   "as many decode only, and of its codec alone")
    p.add_argument("--prompts", default="xvector,icl")
    p.add_argument("--stacks", "--seq-groups", dest="stacks", default=DEFAULT_STACKS,
                   help=f"comma list: 'upstream' and MODE:K (MODE one of {', '.join(MODES)}); a bare K means eager:K")
    p.add_argument("--profile", action="store_true", help="count GPU kernels per frame (first prompt only)")
    p.add_argument("--warm-up", action="store_true", help="make each morph stack's first call (its capture or "
                   "compile) before its timed runs, timed apart as first_call_s: every timed run warm")
    p.add_argument("--agreement",
                   default=",".join(["upstream-eager-attention"] + [f"{m}:15" for m in MODES if m != "auto"]),
                   help="stacks whose greedy codes are compared with upstream's (empty: skip)")
    p.add_argument("--first-call", metavar="MODES", help="instead of the stacks: the first line of a fresh process "
                   "in each of these modes (comma list), with cold and then warm Triton/Inductor caches")
    p.add_argument("--first-call-seq-groups", type=int, default=DEFAULT_SEQ_GROUPS)
    p.add_argument("--first-call-timeout", type=int, default=600, help="seconds allowed to each fresh process")
    p.add_argument("--one-call", metavar="MODE", help=argparse.SUPPRESS)  # the fresh process of --first-call
    p.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)

    if args.one_call:
        print(json.dumps(one_call(args)))
        return {}
    if args.first_call:
        with tempfile.TemporaryDirectory() as tmp:
            model = args.model or str(build_random_model(args.build_into or tmp, args.size, "base", seed=0,
                                                         dtype=DTYPES.get(args.dtype, torch.float32)))
            rows = first_call(args, model)
        report = dict(run_info(resolve_device(args.device)), dtype=args.dtype, attention=args.attention,
                      model=args.model or f"random weights, {args.size} dims", batch=1, frames=args.frames,
                      seq_groups=args.first_call_seq_groups, first_call=rows)
        return emit(report, args.json)

    tts = load_bench_model(args, args.build_into)
    voices = {"xvector": tts.make_voice(reference_wave(), 24000),
              "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}

    results = []
    report = dict(
        run_info(tts.device), dtype=str(tts.tts.model.dtype).replace("torch.", ""), attention=args.attention,
        model=args.model or f"random weights, {args.size} dims", dims=model_dims(tts), batch=1, frames=args.frames,
        repeats=args.repeats,
        order=("per stack: a morph stack's first call apart, then end to end and decode only in turn" if args.warm_up
               else "per stack: end to end, decode only, in turn; the first is its first call here"),
        results=results, complete=False,
    )
    specs = [s if (s == "upstream" or ":" in s) else f"eager:{s}" for s in args.stacks.split(",") if s]
    for i, prompt in enumerate(args.prompts.split(",")):
        runner = Runner(tts, voices[prompt])
        for spec in specs:
            row = dict(stack=stack_name(spec), prompt=prompt)
            try:
                row.update(time_stack(tts, runner, spec, args.frames, args.repeats, profile=args.profile and i == 0,
                                      warm_up=args.warm_up))
            except Exception as e:  # keep the other stacks' numbers
                row["error"] = f"{type(e).__name__}: {e}"
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            save(report, args.json)
    agreement = {}
    agreement_specs = [s for s in args.agreement.split(",") if s]
    if agreement_specs:
        try:
            agreement = greedy_agreement(tts, Runner(tts, voices["xvector"]), args.frames, agreement_specs)
        except Exception as e:
            agreement = {"error": f"{type(e).__name__}: {e}"}

    report.update(greedy_agreement_with_upstream=agreement, complete=True)
    return emit(report, args.json)


if __name__ == "__main__":
    main()
