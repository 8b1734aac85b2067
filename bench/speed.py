"""Side-by-side decode speed: upstream qwen-tts against the morph predictor, in one process.

Every stack decodes the same fixed number of frames (EOS is suppressed, so random
weights cannot stop early) from the same prompt, and the JSON printed at the end
holds the device, the model dims, ms per frame, x real time and peak memory.

    python -m bench.speed --size tiny --device cpu --frames 40          # CI-sized, on CPU
    python -m bench.speed --size 0.6b --device cuda --dtype bf16        # random 0.6B dims on a GPU
    python -m bench.speed --model /path/to/Qwen3-TTS-12Hz-0.6B-Base     # a real checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import sys
import tempfile
import time

import numpy as np
import torch

from bench.random_model import build_random_model
from morph.engine import MorphTTS
from morph.sampling import Sampling
from morph.settings import FRAMES_PER_SECOND, GenerationSettings

TEXT = ("The river ran quietly past the old mill, and the children counted the boats until the sun went down "
        "behind the hills, then walked home along the towpath, telling stories about the people on board.")
REF_TEXT = "The quick brown fox jumps over the lazy dog."


@contextlib.contextmanager
def eos_suppressed(tts: MorphTTS):
    """Random weights emit EOS at random steps; fixed-length timing needs none at all."""
    eos = tts.tts.model.config.talker_config.codec_eos_token_id

    def no_eos(module, args, out):
        out[..., eos] = -float("inf")
        return out

    handle = tts.tts.model.talker.codec_head.register_forward_hook(no_eos)
    try:
        yield
    finally:
        handle.remove()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS on CPU


def time_codes(tts: MorphTTS, voice, frames: int, seq_groups: int | None, repeats: int) -> dict:
    """Decode `frames` frames `repeats` times; seq_groups None means upstream qwen-tts."""
    device = tts.device
    settings = GenerationSettings(seq_groups=seq_groups or 15, do_sample=True, seed=0,
                                  subtalker=Sampling(do_sample=True), max_new_tokens=frames + 1)
    item = tts._prompt_item(voice)
    kwargs = settings.upstream_kwargs(TEXT)
    ids = tts.tts._tokenize_texts([tts.tts._build_assistant_text(TEXT)])
    ref_ids = [tts.tts._tokenize_texts([tts.tts._build_ref_text(REF_TEXT)])[0] if voice.icl else None]
    prompt = tts.tts._prompt_items_to_voice_clone_prompt([item])

    def run():
        torch.manual_seed(0)
        codes, _ = tts.tts.model.generate(input_ids=ids, ref_ids=ref_ids, voice_clone_prompt=prompt,
                                          languages=["english"], **kwargs)
        return codes[0]

    stack = contextlib.nullcontext() if seq_groups else tts.upstream()
    with stack, eos_suppressed(tts), torch.inference_mode():
        if seq_groups:
            tts.patch.seq_groups = seq_groups
        run()  # warm-up: allocator, kernels, one-time metadata
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            codes = run()
            _sync(device)
            times.append(time.perf_counter() - start)
        peak = _peak_bytes(device)
        _sync(device)
        start = time.perf_counter()
        tts.tts.model.speech_tokenizer.decode([{"audio_codes": codes}])
        _sync(device)
        decode_s = time.perf_counter() - start
    got = int(codes.shape[0])
    best = float(np.median(times))
    return dict(
        frames=got, ms_per_frame=round(1000 * best / got, 3),
        x_real_time=round(got / FRAMES_PER_SECOND / best, 3),
        codec_decode_ms_per_frame=round(1000 * decode_s / got, 3),
        peak_memory_gib=round(peak / 2**30, 3), runs_s=[round(t, 3) for t in times],
    )


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


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a checkpoint folder; default: build random weights at --size")
    p.add_argument("--size", default="tiny", choices=["tiny", "tiny-proj", "0.6b", "1.7b"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--attention", default="sdpa", choices=["auto", "sdpa", "eager", "flash_attention_2"])
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--prompts", default="xvector,icl")
    p.add_argument("--seq-groups", default="upstream,15,5",
                   help="comma list: 'upstream' and/or morph seq_groups values")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or build_random_model(tmp, args.size, "base", seed=0)
        tts = MorphTTS.load(str(folder), args.device, args.dtype, args.attention)
    rng = np.random.RandomState(0)
    t = np.arange(4 * 24000) / 24000
    ref = (0.3 * np.sin(2 * np.pi * 190 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.03 * rng.randn(t.size))
    voices = {"xvector": tts.make_voice(ref.astype(np.float32), 24000),
              "icl": tts.make_voice(ref.astype(np.float32), 24000, REF_TEXT)}

    results = []
    for prompt in args.prompts.split(","):
        for stack in args.seq_groups.split(","):
            k = None if stack == "upstream" else int(stack)
            row = dict(stack="upstream qwen-tts" if k is None else f"morph eager k={k}", prompt=prompt)
            row.update(time_codes(tts, voices[prompt], args.frames, k, args.repeats))
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    report = dict(
        device=device_name(tts.device), torch=torch.__version__, dtype=str(tts.tts.model.dtype).replace("torch.", ""),
        attention=args.attention, model=args.model or f"random weights, {args.size} dims",
        dims=model_dims(tts), batch=1, results=results,
    )
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
