"""faster-qwen3-tts-batch on the same model folder, lines and JSON fields as bench/batch.py.

faster-qwen3-tts-batch 0.2.0 builds on faster-qwen3-tts and qwen-tts-hf, so it runs in their
environment (see bench/speed_faster.py):

    PYTHONPATH=/path/to/faster-env:$PWD python -m bench.batch_faster --model DIR --json out/faster_batch.json

The same `--lines` lines as bench/batch.py (about 5 s each: `--frames` frames, EOS held back
through min_new_tokens), all with the x-vector voice of the reference clip (the peer takes one
voice mode per batch), rendered `--batch-size` at a time, measured two ways: decode only (its
batched_fast_generate on prepared inputs: prefill plus decode) and end to end (its public
generate_voice_clone_batch: text in, float32 audio out), after an untimed first batch of
`--warm-frames` frames (its graph capture; with `--warm-frames` equal to `--frames`, every timed run
warm). Sampling as upstream's defaults.

It was written against transformers 4.x; on the GPU machine's 5.17 three of its calls into
transformers need shims (shim_transformers), listed in the report's `shims`.

The report is saved as each phase begins and ends (`running`, `phases_s`: wrap, warm_up, prepare,
decode_only, end_to_end), and a SIGTERM prints every thread's stack (bench.common.stacks_on_timeout),
so a run stopped by its time limit says where it was. `--line-json` first measures the one line of
bench/speed_faster.py on the same loaded model: both peers for one load, in a device call's time.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
from importlib.metadata import version

import numpy as np
import soundfile as sf
import torch

from bench.lines import script
from bench.common import emit, save, stacks_on_timeout
from bench.sentences import reference_wave
from bench.speed_faster import FRAMES_PER_SECOND, SAMPLE_RATE, _timed, line_report, load_faster, peer_head
from bench.workload import sync


def legacy_causal_mask(config, input_embeds, attention_mask, cache_position, past_key_values, **_):
    """transformers 4.x's `create_causal_mask` over a static cache, as the peer calls it to build its masks
    ahead of its CUDA graphs: queries at `cache_position`, keys at every slot of the cache, left padding
    from the 2D `attention_mask`. 5.x renamed `input_embeds` and dropped `cache_position`, taking the query
    offset from the cache instead, which is still empty when the peer builds the masks."""
    keys = torch.arange(past_key_values.get_max_length(), device=input_embeds.device)
    allowed = (keys[None, :] <= cache_position[:, None])[None, None]  # [1, 1, q, kv]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()  # [B, 1, q, kv]
    allowed = allowed.expand(input_embeds.shape[0], 1, -1, -1)
    zero = torch.zeros((), dtype=input_embeds.dtype, device=input_embeds.device)
    return torch.where(allowed, zero, torch.finfo(input_embeds.dtype).min)


def shim_transformers() -> list[str]:
    """Adapt the peer to the installed transformers where it needs it; returns what was done."""
    from faster_qwen3_tts_batch import batched_predictor_graph, batched_talker_graph
    from transformers.cache_utils import DynamicCache, StaticLayer
    from transformers.masking_utils import create_causal_mask

    done = []
    if "cache_position" not in inspect.signature(create_causal_mask).parameters:
        batched_predictor_graph.create_causal_mask = legacy_causal_mask
        batched_talker_graph.create_causal_mask = legacy_causal_mask
        done.append("the peer's create_causal_mask builds transformers 4.x's static-cache mask from cache_position")
    init = StaticLayer.lazy_initialization
    value_states = inspect.signature(init).parameters.get("value_states")
    if value_states is not None and value_states.default is inspect.Parameter.empty:
        def lazy_initialization(self, key_states, value_states=None):
            """5.x requires value_states; the peer passes keys only (same shape in Qwen3-TTS)."""
            return init(self, key_states, key_states if value_states is None else value_states)

        StaticLayer.lazy_initialization = lazy_initialization
        done.append("StaticLayer.lazy_initialization takes the keys' shape for the values when given keys only")
    if not hasattr(DynamicCache, "__getitem__"):
        def layer_tensors(self, index):
            """4.x's `cache[layer]`, which the peer uses to copy its prefill into its static cache."""
            return self.layers[index].keys, self.layers[index].values

        DynamicCache.__getitem__ = layer_tensors
        done.append("DynamicCache[layer] gives that layer's (keys, values) again")
    return done


class Phases:
    """The report saved as each phase of the run begins and ends (`running`, `phases_s`), so that a run stopped by
    its time limit leaves on disk how far it got and what each finished phase took."""

    def __init__(self, report: dict, json_path: str | None, device: torch.device):
        self.report, self.json_path, self.device = report, json_path, device
        report.update(phases_s={}, running=None, complete=False)

    def __call__(self, name: str, run):
        self.report["running"] = name
        save(self.report, self.json_path)
        sync(self.device)
        start = time.perf_counter()
        out = run()
        sync(self.device)
        self.report["phases_s"][name] = round(time.perf_counter() - start, 2)
        self.report["running"] = None
        save(self.report, self.json_path)
        return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--lines", type=int, default=32)
    p.add_argument("--frames", type=int, default=62, help="frames per line (12.5 a second; 62 is about 5 s)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warm-frames", type=int, default=8, help="frames of the untimed first batch (its capture)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--line-json", help="first, on the same loaded model: faster-qwen3-tts's one line "
                   "(bench/speed_faster.py, x-vector voice, --line-frames frames, --repeats runs), written here")
    p.add_argument("--line-frames", type=int, default=250)
    p.add_argument("--json")
    args = p.parse_args(argv)
    stacks_on_timeout()

    from faster_qwen3_tts_batch import BatchedFasterQwen3TTS
    from faster_qwen3_tts_batch.batched_generate import batched_fast_generate

    base, load_s, base_shims = load_faster(args.model)
    if args.line_json:  # before the shims below, so the line runs as bench.speed_faster runs it
        emit(line_report(base, args.model, load_s, base_shims, args.line_frames, args.repeats, "xvector"),
             args.line_json)
    shims = shim_transformers()
    report = dict(peer_head(args.model, load_s, shims + base_shims, "faster-qwen3-tts-batch", "faster-qwen3-tts",
                            "qwen-tts-hf"),
                  lines=args.lines, frames_per_line=args.frames,
                  seconds_per_line=round(args.frames / FRAMES_PER_SECOND, 2), prompts="xvector", repeats=args.repeats,
                  warm_frames=args.warm_frames, base_warmed_by_line=bool(args.line_json), results=[])
    phase = Phases(report, args.json, torch.device("cuda"))
    model = phase("wrap", lambda: BatchedFasterQwen3TTS(base, max_batch_size=args.batch_size))
    options = dict(xvec_only=True, non_streaming_mode=False, append_silence=False)  # as upstream's voice clone
    with tempfile.TemporaryDirectory() as tmp:
        ref = os.path.join(tmp, "reference.wav")  # the peer reads its voice from a file
        sf.write(ref, reference_wave(), SAMPLE_RATE)
        requests = [dict(text=text, language="English", ref_audio=ref, ref_text="") for text in script(args.lines)]
        chunks = [requests[i:i + args.batch_size] for i in range(0, len(requests), args.batch_size)]

        def prepared(chunk):
            """What generate_voice_clone_batch hands batched_fast_generate, built the way it builds it."""
            parts = [base._prepare_generation(text=r["text"], ref_audio=r["ref_audio"], ref_text=r["ref_text"],
                                              language=r["language"], xvec_only=True, non_streaming_mode=False,
                                              append_silence=False) for r in chunk]
            m = parts[0][0]
            return dict(talker=m.talker, talker_input_embeds_list=[x[3] for x in parts],
                        attention_mask_list=[x[4] for x in parts], trailing_text_hiddens_list=[x[5] for x in parts],
                        tts_pad_embed=parts[0][6], config=m.config.talker_config,
                        predictor_graph=model.batched_predictor_graph, talker_graph=model.batched_talker_graph)

        def decode_only(inputs):
            torch.manual_seed(0)
            codes = []
            for kwargs in inputs:
                codes += [c for c, _ in batched_fast_generate(**kwargs, max_new_tokens=args.frames,
                                                              min_new_tokens=args.frames)]
            return codes

        def end_to_end():
            torch.manual_seed(0)
            audio = []
            for chunk in chunks:
                audio += [wavs[0] for wavs, _ in model.generate_voice_clone_batch(
                    chunk, max_new_tokens=args.frames, min_new_tokens=args.frames, **options)]
            return audio

        # the first batch captures the batched graphs (and the base model's, unless the line took them) for this size
        phase("warm_up", lambda: model.generate_voice_clone_batch(chunks[0], max_new_tokens=args.warm_frames,
                                                                  min_new_tokens=args.warm_frames, **options))
        inputs = phase("prepare", lambda: [prepared(chunk) for chunk in chunks])
        walls, peak, codes = phase("decode_only", lambda: _timed(lambda: decode_only(inputs), args.repeats))
        e2e_walls, e2e_peak, audio = phase("end_to_end", lambda: _timed(end_to_end, args.repeats))

    got = [int(c.shape[0]) for c in codes]
    audio_s = sum(got) / FRAMES_PER_SECOND
    wall, e2e_wall = float(np.median(walls)), float(np.median(e2e_walls))
    e2e_audio_s = sum(a.size for a in audio) / SAMPLE_RATE
    row = dict(
        stack=f"faster-qwen3-tts-batch {version('faster-qwen3-tts-batch')}",
        batch_size=args.batch_size, effective_batch=len(chunks[0]), batches=len(chunks), seq_groups=15,
        frames_per_line=[min(got), max(got)], audio_s=round(audio_s, 2), wall_s=round(wall, 3),
        x_real_time=round(audio_s / wall, 2), ms_per_step=round(1000 * wall / (len(chunks) * max(got)), 3),
        peak_memory_gib=round(peak / 2**30, 3), warmup_s=report["phases_s"]["warm_up"],
        runs_s=[round(w, 3) for w in walls],
        end_to_end_audio_s=round(e2e_audio_s, 2), end_to_end_wall_s=round(e2e_wall, 3),
        end_to_end_x_real_time=round(e2e_audio_s / e2e_wall, 2), end_to_end_peak_memory_gib=round(e2e_peak / 2**30, 3),
        end_to_end_runs_s=[round(w, 3) for w in e2e_walls],
    )
    print(json.dumps(row), file=sys.stderr, flush=True)
    report["results"].append(row)
    report["complete"] = True
    return emit(report, args.json)


if __name__ == "__main__":
    main()
