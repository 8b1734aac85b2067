"""Side-by-side decode speed: upstream qwen-tts against the morph stacks, in one process.

Every stack decodes the same fixed number of frames (EOS is held back, so random
weights cannot stop early) from the same prompt. The JSON printed at the end (and
written to --json) holds the device, torch version, model dims, and per stack and prompt:
ms per frame, x real time, peak allocated memory, capture/compile seconds, the first
call's wall time and GPU kernels per frame (torch.profiler kernel events only). It also
holds the bf16 agreement with upstream under greedy decoding at seq_groups=15 and the
top kernels of the fastest exact stack.

Stacks: "upstream" (qwen-tts generate) and MODE:K with MODE one of eager (upstream's
talker + the morph predictor), lean (morph talker loop, no graphs), graphs (CUDA graphs)
or compile (torch.compile'd stacks inside CUDA graphs).

    python -m bench.speed --size tiny --device cpu --frames 40 --stacks upstream,eager:15,eager:5
    python -m bench.speed --size 0.6b --device cuda --dtype bf16 --json out/speed.json   # random 0.6B dims
    python -m bench.speed --model /path/to/Qwen3-TTS-12Hz-0.6B-Base                      # a real checkpoint
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import platform
import resource
import sys
import time

import numpy as np
import torch

from bench.common import add_model_args, emit, load_bench_model
from morph.engine import MorphTTS
from morph.sampling import Sampling
from morph.settings import FRAMES_PER_SECOND, GenerationSettings

TEXT = ("The river ran quietly past the old mill, and the children counted the boats until the sun went down "
        "behind the hills, then walked home along the towpath, telling stories about the people on board.")
REF_TEXT = "The quick brown fox jumps over the lazy dog."
DEFAULT_STACKS = "upstream,eager:15,eager:5,graphs:15,graphs:7,graphs:5,graphs:4,compile:15,compile:7,compile:5,compile:4"


class _Stop(Exception):
    """Raised from the per-frame hook to end a profiled run after a set number of frames."""


def reference_wave(seconds: float = 4.0, sr: int = 24000) -> np.ndarray:
    rng = np.random.RandomState(0)
    t = np.arange(int(seconds * sr)) / sr
    wave = 0.3 * np.sin(2 * np.pi * 190 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.03 * rng.randn(t.size)
    return wave.astype(np.float32)


@contextlib.contextmanager
def eos_suppressed(tts: MorphTTS, frames: int):
    """Random weights emit EOS at random steps; fixed-length timing needs none at all.
    Upstream's talker gets a hook on codec_head; the morph loop holds EOS back itself."""
    eos = tts.tts.model.config.talker_config.codec_eos_token_id

    def no_eos(module, args, out):
        out[..., eos] = -float("inf")
        return out

    handle = tts.tts.model.talker.codec_head.register_forward_hook(no_eos)
    loop = tts.patch.loop
    loop.min_new_tokens = frames + 2
    try:
        yield
    finally:
        handle.remove()
        loop.min_new_tokens = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS on CPU


class Runner:
    """Builds one prompt's inputs once and runs model.generate on it under any stack."""

    def __init__(self, tts: MorphTTS, voice):
        self.tts = tts
        m = tts.tts
        self.ids = m._tokenize_texts([m._build_assistant_text(TEXT)])
        self.ref_ids = [m._tokenize_texts([m._build_ref_text(REF_TEXT)])[0] if voice.icl else None]
        self.prompt = m._prompt_items_to_voice_clone_prompt([tts._prompt_item(voice)])

    def generate(self, frames: int, greedy: bool = False, seed: int = 0):
        sampling = Sampling(do_sample=not greedy)
        settings = GenerationSettings(seq_groups=15, do_sample=not greedy, subtalker=sampling,
                                      max_new_tokens=frames + 1)
        kwargs = settings.upstream_kwargs(TEXT)
        torch.manual_seed(seed)
        codes, _ = self.tts.tts.model.generate(input_ids=self.ids, ref_ids=self.ref_ids, voice_clone_prompt=self.prompt,
                                               languages=["english"], **kwargs)
        return codes[0]


@contextlib.contextmanager
def attention_impl(tts: MorphTTS, impl: str):
    """Switch every sub-model's HF attention implementation for the block."""
    configs = {id(m.config): m.config for m in tts.tts.model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation")}
    saved = {key: c._attn_implementation for key, c in configs.items()}
    for c in configs.values():
        c._attn_implementation = impl
    try:
        yield
    finally:
        for key, c in configs.items():
            c._attn_implementation = saved[key]


@contextlib.contextmanager
def stack(tts: MorphTTS, spec: str):
    """Run the block under a stack: 'upstream', 'upstream-eager-attention' (the same with
    HF's eager attention instead of sdpa: a control for numeric sensitivity) or 'MODE:K'."""
    if spec.startswith("upstream"):
        with tts.upstream(), (attention_impl(tts, "eager") if spec == "upstream-eager-attention"
                              else contextlib.nullcontext()):
            yield
        return
    mode, k = spec.split(":")
    tts.patch.mode, tts.patch.seq_groups = mode, int(k)
    yield


@contextlib.contextmanager
def stop_after(tts: MorphTTS, frames: int, upstream: bool):
    """End generation (with _Stop) when frame `frames` + 1 is about to be decoded."""
    count = [0]

    def tick():
        count[0] += 1
        if count[0] > frames:
            raise _Stop

    if not upstream:
        tts.patch.on_step = tick
        try:
            yield
        finally:
            tts.patch.on_step = None
        return
    cp = tts.tts.model.talker.code_predictor

    def generate(*args, **kwargs):
        tick()
        return type(cp).generate(cp, *args, **kwargs)

    cp.generate = generate
    try:
        yield
    finally:
        vars(cp).pop("generate", None)


def count_kernels(run_frames, a: int, b: int, top: int = 25) -> dict:
    """GPU kernels per frame: profile runs stopped after a and b frames and take the
    difference, which cancels the prompt's prefill. Kernel events only: record_function
    ranges, memcpy and memset are left out."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    per_run = []
    for n in (a, b):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            try:
                run_frames(n)
            except _Stop:
                pass
            torch.cuda.synchronize()
        names = collections.Counter()
        times = collections.Counter()
        for e in prof.events():
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                continue
            if e.name.startswith(("Memcpy", "Memset", "[memory]")) or e.name.lower().startswith("memcpy"):
                continue
            names[e.name] += 1
            times[e.name] += e.time_range.elapsed_us()
        per_run.append((sum(names.values()), names, times))
    frames = b - a
    (na, ca, ta), (nb, cb, tb) = per_run
    diff_t = {k: (tb[k] - ta.get(k, 0)) / frames for k in tb}
    total_us = sum(diff_t.values())
    tops = sorted(diff_t.items(), key=lambda kv: -kv[1])[:top]
    return dict(
        kernels_per_frame=round((nb - na) / frames, 1),
        gpu_kernel_us_per_frame=round(total_us, 1),
        top_kernels=[dict(name=k[:90], us_per_frame=round(v, 2), calls_per_frame=round((cb[k] - ca.get(k, 0)) / frames, 1))
                     for k, v in tops],
    )


def time_stack(tts: MorphTTS, runner: Runner, spec: str, frames: int, repeats: int, profile: bool,
               warm_frames: int) -> dict:
    device = tts.device
    upstream = spec == "upstream"
    row = {}
    with stack(tts, spec), eos_suppressed(tts, frames), torch.inference_mode():
        _sync(device)
        start = time.perf_counter()
        runner.generate(frames if not upstream and not spec.startswith("eager") else warm_frames)
        _sync(device)
        row["first_call_s"] = round(time.perf_counter() - start, 3)
        if not upstream:
            row["capture_or_compile_s"] = tts.patch.last_run.get("capture_s", 0.0)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            codes = runner.generate(frames)
            _sync(device)
            times.append(time.perf_counter() - start)
        peak = _peak_bytes(device)
        start = time.perf_counter()
        tts.tts.model.speech_tokenizer.decode([{"audio_codes": codes}])
        _sync(device)
        decode_s = time.perf_counter() - start
        if profile and device.type == "cuda":
            def run_frames(n):
                with stop_after(tts, n, upstream):
                    runner.generate(frames)
            a, b = (2, 6) if upstream else (4, 24)
            row.update(count_kernels(run_frames, a, b))
    got = int(codes.shape[0])
    best = float(np.median(times))
    row.update(frames=got, ms_per_frame=round(1000 * best / got, 3), x_real_time=round(got / FRAMES_PER_SECOND / best, 2),
               codec_decode_ms_per_frame=round(1000 * decode_s / got, 3), peak_memory_gib=round(peak / 2**30, 3),
               runs_s=[round(t, 3) for t in times])
    return row


def greedy_agreement(tts: MorphTTS, runner: Runner, frames: int, specs: list[str]) -> dict:
    """Fraction of frames whose 16 codes equal upstream's, greedy, seq_groups=15."""
    out = {}

    def codes(spec):
        with stack(tts, spec), eos_suppressed(tts, frames), torch.inference_mode():
            return runner.generate(frames, greedy=True).cpu()

    ref = codes("upstream")
    for spec in specs:
        got = codes(spec)
        n = min(len(ref), len(got))
        same = (ref[:n] == got[:n]).all(dim=1)
        diverge = int((~same).int().argmax()) if not bool(same.all()) else n
        out[spec] = dict(frames=n, fraction_equal=round(float(same.float().mean()), 4), first_divergence=diverge,
                         code0_fraction_equal=round(float((ref[:n, 0] == got[:n, 0]).float().mean()), 4))
    return out


def model_dims(tts: MorphTTS) -> dict:
    talker = tts.tts.model.config.talker_config
    cp = talker.code_predictor_config
    return dict(talker_hidden=talker.hidden_size, talker_layers=talker.num_hidden_layers,
                predictor_hidden=cp.hidden_size, predictor_layers=cp.num_hidden_layers,
                code_groups=talker.num_code_groups,
                parameters_m=round(sum(p.numel() for p in tts.tts.model.parameters()) / 1e6, 1))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def stack_name(spec: str) -> str:
    if spec == "upstream":
        return "upstream qwen-tts"
    mode, k = spec.split(":")
    return f"morph {mode} k={k}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--build-into", help="build the random model into this folder and keep it (for speed_faster)")
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--graph-repeats", type=int, default=3, help="repeats for the graph stacks (they are cheap)")
    p.add_argument("--warm-frames", type=int, default=20, help="warm-up frames for upstream and eager stacks")
    p.add_argument("--prompts", default="xvector,icl")
    p.add_argument("--stacks", "--seq-groups", dest="stacks", default=DEFAULT_STACKS,
                   help="comma list: 'upstream' and MODE:K (MODE eager, lean, graphs or compile); "
                        "a bare K means eager:K")
    p.add_argument("--profile", action="store_true", help="count GPU kernels per frame (first prompt only)")
    p.add_argument("--agreement", default="upstream-eager-attention,eager:15,lean:15,graphs:15,compile:15",
                   help="stacks whose greedy codes are compared with upstream's (empty: skip)")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)

    tts = load_bench_model(args, args.build_into)
    voices = {"xvector": tts.make_voice(reference_wave(), 24000),
              "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}

    results = []
    specs = [s if (s == "upstream" or ":" in s) else f"eager:{s}" for s in args.stacks.split(",") if s]
    for i, prompt in enumerate(args.prompts.split(",")):
        runner = Runner(tts, voices[prompt])
        for spec in specs:
            graph_stack = spec.split(":")[0] in ("graphs", "compile")
            row = dict(stack=stack_name(spec), prompt=prompt)
            try:
                row.update(time_stack(tts, runner, spec, args.frames, args.graph_repeats if graph_stack else args.repeats,
                                      profile=args.profile and i == 0, warm_frames=args.warm_frames))
                if spec != "upstream":
                    row["ran_as"] = tts.patch.last_run.get("mode")
            except Exception as e:  # keep the other stacks' numbers
                row["error"] = f"{type(e).__name__}: {e}"
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    agreement = {}
    agreement_specs = [s for s in args.agreement.split(",") if s]
    if agreement_specs:
        try:
            agreement = greedy_agreement(tts, Runner(tts, voices["xvector"]), args.frames, agreement_specs)
        except Exception as e:
            agreement = {"error": f"{type(e).__name__}: {e}"}
    import transformers

    report = dict(
        device=device_name(tts.device), torch=torch.__version__, transformers=transformers.__version__,
        dtype=str(tts.tts.model.dtype).replace("torch.", ""), attention=args.attention,
        model=args.model or f"random weights, {args.size} dims", dims=model_dims(tts), batch=1, frames=args.frames,
        results=results, greedy_agreement_with_upstream=agreement,
    )
    return emit(report, args.json)


if __name__ == "__main__":
    main()
