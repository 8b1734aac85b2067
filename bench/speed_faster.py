"""faster-qwen3-tts on the same model folder, settings and JSON fields as bench/speed.py.

faster-qwen3-tts 0.5.4 needs transformers 5.15.1 and qwen-tts-hf (which installs the same
import name `qwen_tts` as qwen-tts 0.1.1), so it runs in its own environment:

    PYTHONPATH=/path/to/faster-env python -m bench.speed_faster --model DIR --json out/faster.json

DIR is a folder bench/speed.py built (--build-into) or a real checkpoint. Same text,
reference audio, prompts, 250 fixed frames (EOS held back through min_new_tokens), bf16,
batch 1, sampling settings as upstream's defaults. Timing covers prefill plus decode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np
import torch

from bench.common import emit
from bench.speed import REF_TEXT, TEXT, _Stop, count_kernels, reference_wave

FRAMES_PER_SECOND = 12.5


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--frames", type=int, default=250)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", default="xvector,icl")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import faster_qwen3_tts
    import transformers
    from faster_qwen3_tts import FasterQwen3TTS
    from faster_qwen3_tts.generate import fast_generate

    start = time.perf_counter()
    model = FasterQwen3TTS.from_pretrained(args.model, device="cuda", dtype=torch.bfloat16, attn_implementation="sdpa")
    load_s = time.perf_counter() - start
    wave = reference_wave()
    results = []
    first = True
    for i, prompt in enumerate(args.prompts.split(",")):
        icl = prompt == "icl"
        items = model.model.create_voice_clone_prompt(ref_audio=(wave, 24000), ref_text=REF_TEXT if icl else None,
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
                                     max_new_tokens=args.frames, min_new_tokens=args.frames, temperature=0.9,
                                     top_k=50, top_p=1.0, do_sample=True, repetition_penalty=1.05)
            return codes

        row = dict(stack="faster-qwen3-tts 0.5.4", prompt=prompt)
        with torch.inference_mode():
            torch.cuda.synchronize()
            start = time.perf_counter()
            run(args.frames)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - start + prepare_s, 3)
            row["capture_or_compile_s"] = round(prepare_s, 3) if first else 0.0
            first = False
            torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                codes = run(args.frames)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            peak = torch.cuda.max_memory_allocated()
            if args.profile and i == 0:
                graph = model.predictor_graph
                original = graph.run

                def run_frames(n):
                    count = [0]

                    def limited(*a, **k):
                        count[0] += 1
                        if count[0] > n:
                            raise _Stop
                        return original(*a, **k)

                    graph.run = limited
                    try:
                        run(args.frames)
                    finally:
                        graph.run = original

                row.update(count_kernels(run_frames, 4, 24))
        got = int(codes.shape[0])
        best = float(np.median(times))
        row.update(frames=got, ms_per_frame=round(1000 * best / got, 3), x_real_time=round(got / FRAMES_PER_SECOND / best, 2),
                   peak_memory_gib=round(peak / 2**30, 3), runs_s=[round(t, 3) for t in times])
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, transformers=transformers.__version__,
                  faster_qwen3_tts=faster_qwen3_tts.__version__, dtype="bfloat16", attention="sdpa",
                  model=args.model, load_s=round(load_s, 1), batch=1, frames=args.frames, results=results)
    return emit(report, args.json)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
