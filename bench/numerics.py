"""Teacher-forced numerics: how far each decode stack's logits drift from a high-precision reference.

Greedy or sampled code agreement cannot tell a harmless reordering of roundings from real
drift (a near-tied argmax flips either way). So every stack is fed the same codes instead:

1. Upstream qwen-tts, loaded in fp32, generates a fixed sequence of frames (x-vector and ICL
   prompts, upstream's default sampling, seed 0, EOS held back); its talker inputs (prompt
   embeddings, trailing text) and the 16 codes of every frame are recorded.
2. Each stack is teacher forced with exactly those codes: the talker gets one prefill and one
   step per frame; the code predictor gets, per frame, the 2-token prefill [past hidden,
   embedding of code 0] and then one pass per group fed the recorded code of the group before.
   The talker's logits and every predictor group's logits (1..15) are kept.
3. Against the reference (the same upstream computation in higher precision: fp32 on the GPU,
   fp64 on the CPU by default) each stack gets, per group: mean KL(reference || stack), top-1
   agreement on the positions where the reference's top-2 logit margin exceeds MARGIN, and the
   maximum |logit error|. The talker's logits are restricted to the ids upstream can sample
   (codes 0..vocab-1025 and EOS: generate suppresses the rest).

Recording and forcing live in bench/teacher_forcing.py; this module scores and gates the stacks.
Stacks, all in the low precision (--dtype) on one copy of the model's own modules:
- upstream: qwen-tts's HF layers, prefill and DynamicCache decode as its generate runs them.
  morph's "eager" mode runs these same HF layers (bit-identical to upstream at k=15,
  tests/morph/test_exactness.py), so this row is eager's too.
- lean:     the lean layers of morph/decode/lean.py, op by op, the talker on static KV buffers
            after upstream's prefill (as the engine's talker loop does);
- graphs:   the same calls captured in CUDA graphs (GPU only);

seq_groups k: groups 1..k are the sequential passes above; at k<15 groups k+1..15 come from
the crossbar, the hidden state that produced group k times the stacked lm_heads (one
einsum, as the engine does), in every stack and in the reference alike. The sequential
passes do not depend on k (the codes are forced), so one run per stack serves every k.

The gate: upstream's own low-precision run is the yardstick. Every other stack's KL and max
error must stay <= GATE_FACTOR x upstream's, per group (talker, 1..15), at every k. The
command exits 1 when it fails. Measured on the CPU (tiny model): fp32 stacks against fp64
differ by a few fp32 ulps of the logits, where a single maximum moves by more than 1.25x from
rounding alone; bf16 against fp32 is the regime the gate is meant for.

    python -m bench.numerics --size 0.6b --device cuda --dtype bf16 --json out/numerics.json
    python -m bench.numerics --size tiny --device cpu --frames 20          # fp32 stacks vs fp64
    python -m bench.numerics --model /path/to/Qwen3-TTS-12Hz-0.6B-Base --device cuda --dtype bf16
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import add_model_args, device_name, emit, project_commit
from bench.random_model import build_random_model
from bench.teacher_forcing import Logits, hf_stack, lean_stack, record
from bench.sentences import reference_wave
from bench.workload import REF_TEXT, TEXT
from morph import graphs
from morph.decode import runner
from morph.api import MorphTTS

STACKS = ("upstream", "lean", "graphs", "fused")
YARDSTICK = "upstream"
KS = (15, 5)
GATE_FACTOR = 1.25
# A reference top-1 counts as "clear" when it beats the runner-up by this many nats of logit:
# its probability is then >= e^0.1 = 1.105x the runner-up's. Ties closer than that flip
# under any reordering of roundings (upstream's own bf16 run flips them too), so top-1
# agreement is only scored where the reference's choice is clear.
MARGIN = 0.1
DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- metrics and the gate -------------------------------------------------------------------
def group_metrics(ref: torch.Tensor, got: torch.Tensor, margin: float = MARGIN) -> dict:
    """Drift of one group's logits [N, V] from the reference's, in float64.

    KL(p_ref || p_stack) is computed from the logit differences d = ref - stack, as
    sum(p d) + log1p(sum(p expm1(-d))): the textbook sum(p (log p - log q)) subtracts two
    log-probabilities of size ~log V, whose fp64 rounding (~1e-15) would swamp the KL of an
    fp32 stack (~1e-16)."""
    d = ref - got
    p = ref.softmax(-1)
    kl = (p * d).sum(-1) + torch.log1p((p * torch.expm1(-d)).sum(-1))
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > margin
    agree = (ref.argmax(-1) == got.argmax(-1))[clear]
    return dict(kl=float(kl.mean()), max_err=float(d.abs().max()),
                top1=float(agree.double().mean()) if bool(clear.any()) else None, clear=int(clear.sum()),
                positions=int(ref.shape[0]))


def stack_metrics(ref: list[Logits], got: list[Logits], k: int, allowed: torch.Tensor, margin: float) -> dict:
    """Per group (talker, 1..15) over every recording's frames."""
    row = {"talker": group_metrics(torch.cat([r.talker[:, allowed] for r in ref]),
                                   torch.cat([g.talker[:, allowed] for g in got]), margin)}
    ref_g, got_g = torch.cat([r.at(k) for r in ref], 1), torch.cat([g.at(k) for g in got], 1)
    row.update({str(g + 1): group_metrics(ref_g[g], got_g[g], margin) for g in range(ref_g.shape[0])})
    return row


def gate(results: dict, factor: float = GATE_FACTOR) -> list[str]:
    """Every stack's KL and max error within factor x the yardstick's, per k and group; returns the failures."""
    fails = []
    for k, rows in results.items():
        base = rows[YARDSTICK]
        for name, row in rows.items():
            for group, m in row.items():
                for key in ("kl", "max_err"):
                    if name != YARDSTICK and m[key] > factor * base[group][key]:
                        fails.append(f"{name} k={k} group {group}: {key} {m[key]:.3g} > {factor} x "
                                     f"{YARDSTICK}'s {base[group][key]:.3g}")
    return fails


# -- the run ---------------------------------------------------------------------------------
def available(stack: str, device: torch.device) -> str | None:
    """None if the stack can run here, else why not."""
    if stack in runner.FAST_MODES and device.type != "cuda":
        return "needs CUDA"
    if stack == "fused" and not graphs.triton_available():
        return "Triton is unavailable"
    return None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def compare(tts: MorphTTS, dtype: torch.dtype, ref_dtype: torch.dtype, frames: int = 100, stacks=STACKS, ks=KS,
            prompts=("xvector", "icl"), variants: dict | None = None, margin: float = MARGIN) -> dict:
    """Record, teacher force every stack, and score it against the reference: the report's core.

    `variants` adds gated stacks: name -> {morph.decode.lean function name: replacement}, each run as
    "lean" with those functions swapped in (a candidate fix, or a deliberately worse norm)."""
    device = tts.device
    voices = {"xvector": tts.make_voice(reference_wave(), 24000),
              "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}
    start = time.perf_counter()
    recs = [record(tts, voices[p], TEXT, frames) for p in prompts]
    _log(f"numerics: recorded {frames} frames x {len(prompts)} prompts in {time.perf_counter() - start:.1f} s")
    talker = tts.tts.model.talker
    with tts.upstream(), torch.inference_mode():
        ref_model = talker if talker.dtype == ref_dtype else copy.deepcopy(talker).to(ref_dtype)
        low = copy.deepcopy(talker).to(dtype)  # the lean stacks re-fuse its weights: never the user's model
        cfg = talker.config
        allowed = torch.tensor([i for i in range(cfg.vocab_size)
                                if i < cfg.vocab_size - 1024 or i == cfg.codec_eos_token_id])

        def timed(name, fn):
            t0 = time.perf_counter()
            out = [fn(rec) for rec in recs]
            _log(f"numerics: {name} in {time.perf_counter() - t0:.1f} s")
            return out

        ref = timed(f"reference ({ref_dtype})", lambda rec, model=ref_model: hf_stack(model, rec, ks, ref_dtype))
        del ref_model
        logits, skipped = {}, {}
        for name in stacks:
            why = available(name, device)
            if why:
                skipped[name] = why
            elif name == "upstream":
                logits[name] = timed(f"upstream ({dtype})", lambda rec: hf_stack(low, rec, ks, dtype))
            else:
                logits[name] = timed(f"{name} ({dtype})", lambda rec: lean_stack(low, rec, ks, dtype, name))
        for name, overrides in (variants or {}).items():
            logits[name] = timed(f"{name} ({dtype})", lambda rec: lean_stack(low, rec, ks, dtype, "lean", overrides))
    results = {str(k): {name: stack_metrics(ref, got, k, allowed, margin) for name, got in logits.items()}
               for k in ks}
    return dict(results=results, skipped=skipped, gate_failures=gate(results) if YARDSTICK in logits else None,
                frames=frames, prompts=list(prompts), dtype=str(dtype).replace("torch.", ""),
                reference_dtype=str(ref_dtype).replace("torch.", ""), margin=margin, gate_factor=GATE_FACTOR,
                variants={name: sorted(o) for name, o in (variants or {}).items()})


def markdown(report: dict) -> str:
    """One table per k: a row per group, a column per stack, each cell KL / max |error| / top-1."""
    lines = [f"Teacher-forced drift of {report['dtype']} stacks from the {report['reference_dtype']} reference, "
             f"{report['frames']} frames x {len(report['prompts'])} prompts ({', '.join(report['prompts'])}). "
             f"Cell: mean KL(ref || stack) / max |logit error| / top-1 agreement where the reference's top-2 "
             f"margin > {report['margin']}. Gate: KL and max error <= {report['gate_factor']} x {YARDSTICK}'s; "
             "**bold** cells fail it."]
    failing = set()
    for f in report["gate_failures"] or []:
        name, k, _, group = f.split(":")[0].split()
        failing.add((k.split("=")[1], name, group))
    for k, rows in report["results"].items():
        names = list(rows)
        lines += ["", f"**seq_groups {k}**" + ("" if k == "15" else f" (groups {int(k) + 1}..15 from the crossbar)"),
                  "", "| group | clear | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for group in rows[names[0]]:
            cells = []
            for name in names:
                m = rows[name][group]
                top1 = "-" if m["top1"] is None else f"{m['top1']:.0%}"
                cell = f"{m['kl']:.2e} / {m['max_err']:.2e} / {top1}"
                cells.append(f"**{cell}**" if (k, name, group) in failing else cell)
            lines.append(f"| {group} | {rows[names[0]][group]['clear']} | " + " | ".join(cells) + " |")
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{n} ({why})" for n, why in report["skipped"].items())]
    failures = report["gate_failures"]
    lines += ["", "Gate: " + ("not run (no upstream row)" if failures is None
                              else "PASS" if not failures else f"FAIL ({len(failures)} cells)")]
    return "\n".join(lines) + "\n"


def resolve_dtypes(dtype: str, ref_dtype: str, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """auto: bf16 stacks against fp32 on CUDA, fp32 stacks against fp64 elsewhere."""
    low = DTYPES[dtype] if dtype != "auto" else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if ref_dtype != "auto":
        return low, DTYPES[ref_dtype]
    return low, torch.float64 if low == torch.float32 else torch.float32


def main(argv=None) -> dict:
    import transformers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--ref-dtype", default="auto", choices=["auto", "fp32", "fp64"],
                   help="the reference's precision (auto: fp32 for bf16/fp16 stacks, fp64 for fp32 stacks)")
    p.add_argument("--frames", type=int, default=100, help="frames recorded per prompt")
    p.add_argument("--stacks", default=",".join(STACKS))
    p.add_argument("--seq-groups", default=",".join(map(str, KS)), help="comma list of k")
    p.add_argument("--prompts", default="xvector,icl")
    p.add_argument("--margin", type=float, default=MARGIN)
    p.add_argument("--json", help="write the report here too")
    p.add_argument("--markdown", help="write the table here too")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            start = time.perf_counter()
            # released checkpoints are stored in bf16; the model is loaded in fp32 either way
            folder = build_random_model(tmp, args.size, "base", seed=0, dtype=torch.bfloat16)
            _log(f"numerics: built random {args.size} weights in {time.perf_counter() - start:.0f} s")
        tts = MorphTTS.load(str(folder), args.device, "fp32", args.attention)
    dtype, ref_dtype = resolve_dtypes(args.dtype, args.ref_dtype, tts.device)
    report = compare(tts, dtype, ref_dtype, args.frames, [s for s in args.stacks.split(",") if s],
                     [int(k) for k in args.seq_groups.split(",")], args.prompts.split(","), margin=args.margin)
    report = dict(**project_commit(), device=device_name(tts.device), torch=torch.__version__,
                  transformers=transformers.__version__, attention=args.attention,
                  model=args.model or f"random weights, {args.size} dims", **report)
    table = markdown(report)
    emit(report, args.json)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if report["gate_failures"]:
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
