"""faster-qwen3-tts on the same model folder, settings and JSON fields as bench/speed.py.

faster-qwen3-tts 0.5.4 needs qwen-tts-hf (which installs the same import name `qwen_tts` as
qwen-tts 0.1.1), so it runs in its own environment:

    PYTHONPATH=/path/to/faster-env:$PWD python -m bench.speed_faster --model DIR --json out/faster.json

DIR is a folder bench/random_model.py built or a real checkpoint. Same text, reference audio,
prompts, 250 fixed frames (EOS held back through min_new_tokens), bf16, batch 1, sampling
settings as upstream's defaults. Two measurements, as in bench/speed.py: decode only (its
fast_generate on prepared inputs: prefill plus decode) and end to end (its public
generate_voice_clone: text in, audio out), each after a first call timed apart, so every timed
run is warm (bench/speed.py --warm-up takes the morph stacks the same way).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from importlib.metadata import version

import numpy as np
import torch

from bench.common import emit, run_info, stacks_on_timeout
from bench.kernel_count import Stop, count_kernels
from bench.sentences import reference_wave
from bench.workload import REF_TEXT, TEXT

FRAMES_PER_SECOND = 12.5
SAMPLE_RATE = 24000


def _rope_default_for_mimi(hf_default):
    """qwen-tts-hf registers a `default` RoPE initialiser in transformers' own table that reads
    `config.rope_theta`. On transformers 5.17 (the GPU machine's) Mimi's config keeps it in
    `rope_parameters` only, so loading any Qwen3-TTS speech tokenizer fails; Mimi's own initialiser
    reads it from there."""
    from transformers.models.mimi.modeling_mimi import MimiRotaryEmbedding

    def default(config, device=None, seq_len=None, layer_type=None):
        if getattr(config, "rope_theta", None) is None:
            return MimiRotaryEmbedding.compute_default_rope_parameters(config, device)
        return hf_default(config, device, seq_len, layer_type)

    return default


def load_faster(model_dir: str):
    """FasterQwen3TTS on model_dir (bf16, sdpa), its load seconds, and the shims the installed
    transformers needed (recorded in the report, since they change the peer's code path)."""
    import qwen_tts  # noqa: F401 - registers qwen-tts-hf's RoPE initialiser, which the shim wraps
    from faster_qwen3_tts import FasterQwen3TTS
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.mimi.configuration_mimi import MimiConfig

    shims = []
    if getattr(MimiConfig(), "rope_theta", None) is None:
        ROPE_INIT_FUNCTIONS["default"] = _rope_default_for_mimi(ROPE_INIT_FUNCTIONS["default"])
        shims.append("RoPE 'default' initialiser reads Mimi's rope_theta from rope_parameters")
    start = time.perf_counter()
    model = FasterQwen3TTS.from_pretrained(model_dir, device="cuda", dtype=torch.bfloat16, attn_implementation="sdpa")
    torch.cuda.synchronize()
    return model, time.perf_counter() - start, shims


def peer_head(folder: str, load_s: float, shims: list[str], *packages: str) -> dict:
    """What a peer's report starts with: the run, the packages measured, how they were loaded and shimmed."""
    return dict(run_info(torch.device("cuda")), packages={p: version(p) for p in packages}, shims=shims,
                dtype="bfloat16", attention="sdpa", model=folder, load_s=round(load_s, 1))


def _timed(run, repeats: int) -> tuple[list[float], int, object]:
    """Wall seconds of each run, the peak allocated memory over them, and the last result."""
    torch.cuda.reset_peak_memory_stats()
    times, out = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times, torch.cuda.max_memory_allocated(), out


def line_report(model, folder: str, load_s: float, shims: list[str], frames: int, repeats: int, prompts: str,
                profile: bool = False) -> dict:
    """The report of `model` (loaded from `folder` by load_faster) on the line, per prompt: its first call, then
    `repeats` runs decode only and `repeats` end to end, every timed run warm."""
    from faster_qwen3_tts.generate import fast_generate

    wave = reference_wave()
    results = []
    first = True
    for i, prompt in enumerate(prompts.split(",")):
        icl = prompt == "icl"
        items = model.model.create_voice_clone_prompt(ref_audio=(wave, SAMPLE_RATE), ref_text=REF_TEXT if icl else None,
                                                      x_vector_only_mode=not icl)
        start = time.perf_counter()
        m, talker, config, tie, tam, tth, tpe, _ = model._prepare_generation(
            text=TEXT, language="English", voice_clone_prompt=items, ref_text=REF_TEXT if icl else "")
        prepare_s = time.perf_counter() - start

        def run(frames):
            talker.rope_deltas = None
            torch.manual_seed(0)
            codes, _ = fast_generate(talker=talker, talker_input_embeds=tie, attention_mask=tam,
                                     trailing_text_hiddens=tth, tts_pad_embed=tpe, config=config,
                                     predictor_graph=model.predictor_graph, talker_graph=model.talker_graph,
                                     max_new_tokens=frames, min_new_tokens=frames, temperature=0.9,
                                     top_k=50, top_p=1.0, do_sample=True, repetition_penalty=1.05)
            return codes

        def speak():
            torch.manual_seed(0)
            wavs, _ = model.generate_voice_clone(text=TEXT, language="English", voice_clone_prompt=items,
                                                 max_new_tokens=frames, min_new_tokens=frames)
            return wavs[0]

        row = dict(stack=f"faster-qwen3-tts {version('faster-qwen3-tts')}", prompt=prompt)
        with torch.inference_mode():
            torch.cuda.synchronize()
            start = time.perf_counter()
            run(frames)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - start + prepare_s, 3)
            row["capture_or_compile_s"] = round(prepare_s, 3) if first else 0.0
            first = False
            times, peak, codes = _timed(lambda: run(frames), repeats)
            if profile and i == 0:
                graph = model.predictor_graph
                original = graph.run

                def run_frames(n):
                    count = [0]

                    def limited(*a, **k):
                        count[0] += 1
                        if count[0] > n:
                            raise Stop
                        return original(*a, **k)

                    graph.run = limited
                    try:
                        run(frames)
                    finally:
                        graph.run = original

                row.update(count_kernels(run_frames, 4, 24))
        # as a caller of the public API runs it: outside inference mode; its first call apart (the codec's first
        # shapes), as bench.speed --warm-up takes a morph stack's
        row["end_to_end_first_s"] = round(_timed(speak, 1)[0][0], 3)
        e2e_times, e2e_peak, audio = _timed(speak, repeats)
        got = int(codes.shape[0])
        best = float(np.median(times))
        e2e = float(np.median(e2e_times))
        e2e_frames = round(audio.size / (SAMPLE_RATE / FRAMES_PER_SECOND))
        row.update(frames=got, warmed_up=True, ms_per_frame=round(1000 * best / got, 3),
                   x_real_time=round(got / FRAMES_PER_SECOND / best, 2),
                   peak_memory_gib=round(peak / 2**30, 3), runs_s=[round(t, 3) for t in times],
                   end_to_end_frames=e2e_frames, end_to_end_ms_per_frame=round(1000 * e2e / e2e_frames, 3),
                   end_to_end_x_real_time=round(audio.size / SAMPLE_RATE / e2e, 2),
                   end_to_end_peak_memory_gib=round(e2e_peak / 2**30, 3),
                   end_to_end_runs_s=[round(t, 3) for t in e2e_times])
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return dict(peer_head(folder, load_s, shims, "faster-qwen3-tts", "qwen-tts-hf"), batch=1, frames=frames,
                repeats=repeats, results=results)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", default="xvector,icl")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    stacks_on_timeout()
    model, load_s, shims = load_faster(args.model)
    return emit(line_report(model, args.model, load_s, shims, args.frames, args.repeats, args.prompts, args.profile),
                args.json)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
