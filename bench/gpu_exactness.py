"""GPU-only exactness of the graph path (not part of CPU CI).

On CUDA in fp32 one line is decoded on the engine op by op (mode "lean") and from CUDA graphs
(mode "graphs", the same `frame_step` captured), greedy and seeded-sampled, at
seq_groups 15 and 5: the codes must be identical. It also checks that the graph-safe
draw equals torch.multinomial on CUDA, and reports how often the lean layers agree with
upstream's talker + eager predictor (mode "eager").

    python -m bench.gpu_exactness --model DIR [--frames 60] --json out/exact.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from bench.common import emit
from bench.stacks import Runner, stack
from bench.sentences import reference_wave
from bench.workload import REF_TEXT
from morph.api import MorphTTS
from morph.decode.sampling import draw, torch_noise


def multinomial_matches_draw() -> bool:
    probs = torch.randn(37, 2048, device="cuda").mul(3).softmax(-1)
    torch.manual_seed(7)
    a = torch.multinomial(probs, 1).squeeze(1)
    torch.manual_seed(7)
    b = draw(probs, torch_noise(probs))
    return bool(torch.equal(a, b))


def codes(tts, runner, spec, frames, greedy):
    with stack(tts, spec), torch.inference_mode():
        out = runner.generate(frames, greedy=greedy, seed=123).cpu()
        ran = tts.patch.last_run.get("mode") if spec != "upstream" else "upstream"
    return out, ran


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--json")
    args = p.parse_args(argv)

    tts = MorphTTS.load(args.model, "cuda", "fp32", "sdpa")
    voices = {"xvector": tts.make_voice(reference_wave(), 24000),
              "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}
    checks, ok = [], True
    multinomial_ok = multinomial_matches_draw()
    ok &= multinomial_ok
    for prompt, voice in voices.items():
        runner = Runner(tts, voice)
        for k in (15, 5):
            for greedy in (True, False):
                lean, ran_lean = codes(tts, runner, f"lean:{k}", args.frames, greedy)
                graph, ran_graph = codes(tts, runner, f"graphs:{k}", args.frames, greedy)
                equal = lean.shape == graph.shape and bool(torch.equal(lean, graph))
                ok &= equal and ran_graph == "graphs" and ran_lean == "lean"
                row = dict(prompt=prompt, seq_groups=k, greedy=greedy, frames=int(lean.shape[0]),
                           graphs_equal_lean=equal, ran=[ran_lean, ran_graph])
                if greedy:
                    eager, _ = codes(tts, runner, f"eager:{k}", args.frames, greedy)
                    n = min(len(eager), len(lean))
                    row["lean_vs_eager_fraction_equal"] = round(float((eager[:n] == lean[:n]).all(1).float().mean()), 4)
                checks.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype="float32",
                  multinomial_equals_graph_safe_draw=multinomial_ok, checks=checks, all_equal=bool(ok))
    return emit(report, args.json)


if __name__ == "__main__":
    sys.exit(0 if main()["all_equal"] else 1)
