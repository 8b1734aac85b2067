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
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from bench.common import add_model_args, emit, project_commit
from bench.random_model import build_random_model
from bench.speed import REF_TEXT, TEXT, device_name, reference_wave
from morph import graphs
from morph.decode import lean, runner
from morph.engine import MorphTTS
from morph.settings import GenerationSettings

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


# -- recording the forced codes ------------------------------------------------------------
@dataclass
class Recording:
    """What upstream's talker.generate was given, and the codes [N, 16] it produced."""

    prompt: torch.Tensor  # [1, L, H] prompt embeddings
    text: torch.Tensor  # [1, T, H] trailing text, consumed one row per frame
    pad: torch.Tensor  # [1, 1, H] tts_pad, after the text runs out
    codes: torch.Tensor  # [N, 16] int64

    def text_for(self, frame: int) -> torch.Tensor:
        return self.text[:, frame:frame + 1] if frame < self.text.shape[1] else self.pad


@contextmanager
def _eos_held_back(talker):
    """Random weights emit EOS at random frames; a fixed-length recording needs none."""
    eos = talker.config.codec_eos_token_id

    def no_eos(module, args, out):
        out[..., eos] = -float("inf")
        return out

    handle = talker.codec_head.register_forward_hook(no_eos)
    try:
        yield
    finally:
        handle.remove()


def record(tts: MorphTTS, voice, text: str, frames: int, settings: GenerationSettings | None = None,
           hold_eos: bool = True) -> Recording:
    """Run upstream qwen-tts (the loaded precision) and keep its talker inputs and codes.

    settings: upstream's default sampling with seed 0 unless given; seq_groups is ignored.
    With hold_eos, exactly `frames` frames; without, up to `frames`, ending where upstream's would."""
    talker = tts.tts.model.talker
    seen = {}

    def generate(**kwargs):
        seen.update(kwargs)
        seen["result"] = type(talker).generate(talker, **kwargs)
        return seen["result"]

    settings = replace(settings or GenerationSettings(seed=0), max_new_tokens=frames)
    with tts.upstream(), _eos_held_back(talker) if hold_eos else nullcontext():
        talker.generate = generate
        try:
            torch.manual_seed(settings.seed or 0)
            tts.tts.generate_voice_clone(text=text, language="English", voice_clone_prompt=[tts._prompt_item(voice)],
                                         **settings.upstream_kwargs(text))
        finally:
            vars(talker).pop("generate", None)
    codes = torch.stack([h[-1] for h in seen["result"].hidden_states if h[-1] is not None], dim=1)[0]
    if not hold_eos:  # upstream keeps the frames before the first EOS
        codes = codes[:int((codes[:, 0] == talker.config.codec_eos_token_id).int().cumsum(0).eq(0).sum())]
    if seen["inputs_embeds"].shape[0] != 1 or (hold_eos and codes.shape[0] != frames):
        raise RuntimeError(f"recording: expected one row of {frames} frames, got {tuple(codes.shape)}")
    return Recording(seen["inputs_embeds"], seen["trailing_text_hidden"], seen["tts_pad_embed"], codes)


# -- teacher-forced stacks ----------------------------------------------------------------
@dataclass
class Logits:
    """One stack's logits on one recording, on the CPU in float64 (a reference's digits are kept)."""

    talker: torch.Tensor  # [N, V_talker]
    groups: torch.Tensor  # [15, N, V]: the sequential passes, group g at row g - 1
    crossbar: dict  # k -> [15 - k, N, V]: groups k+1..15 read off group k's hidden state

    def at(self, k: int) -> torch.Tensor:
        """Groups 1..15 as a stack running seq_groups=k produces them."""
        return self.groups if k == 15 else torch.cat((self.groups[:k], self.crossbar[k]))


def _crossbar(hidden: torch.Tensor, cp, k: int) -> torch.Tensor:
    heads = torch.stack([cp.lm_head[g].weight for g in range(k, len(cp.lm_head))])
    return torch.einsum("bh,gvh->bgv", hidden, heads)[0]  # [15 - k, V]


def _step_input(talker, codes: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """The talker's input for a frame, as upstream sums it: code 0's and the 15 groups'
    embeddings, plus the frame's trailing text."""
    cp = talker.code_predictor
    embeds = [talker.model.codec_embedding(codes[:1])] + [cp.model.codec_embedding[g](codes[g + 1:g + 2])
                                                         for g in range(len(cp.model.codec_embedding))]
    return torch.cat(embeds).sum(0)[None, None] + text


def _collect(talker_logits, group_logits, hiddens, cp, ks) -> Logits:
    """Per-frame lists -> a Logits; hiddens[j][g] is the hidden state that produced group g + 1."""
    crossbar = {k: torch.stack([_crossbar(h[k - 1], cp, k) for h in hiddens], dim=1).double().cpu()
                for k in ks if k < 15}
    groups = torch.stack([torch.cat(f) for f in group_logits], dim=1)  # [15, N, V]
    return Logits(torch.cat(talker_logits).double().cpu(), groups.double().cpu(), crossbar)


def _prefill(talker, rec: Recording, dtype):
    """Upstream's talker prefill over the prompt: (cache, logits of frame 0's code 0, past hidden)."""
    from transformers.cache_utils import DynamicCache

    x = rec.prompt.to(dtype)
    n = x.shape[1]
    cache = DynamicCache()
    h = talker.model(inputs_embeds=x, attention_mask=torch.ones(1, n, dtype=torch.long, device=x.device),
                     past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(n, device=x.device)).last_hidden_state
    return cache, talker.codec_head(h)[:, -1], h[:, -1:]


def hf_stack(talker, rec: Recording, ks, dtype) -> Logits:
    """Upstream's HF layers, teacher forced, as qwen-tts's generate calls them."""
    from transformers.cache_utils import DynamicCache

    cp = talker.code_predictor
    dev = rec.prompt.device
    cache, logits, past = _prefill(talker, rec, dtype)
    n = rec.prompt.shape[1]
    talker_logits, group_logits, hiddens = [logits], [], []
    for j, codes in enumerate(rec.codes):
        # the code predictor's generate: a fresh cache, a 2-token prefill, one token per group
        pcache, x, frame_logits, frame_hidden, start = DynamicCache(), None, [], [], 0
        for g in range(15):
            x = torch.cat((past, talker.model.codec_embedding(codes[:1])[None]), 1) if g == 0 \
                else cp.model.codec_embedding[g - 1](codes[g:g + 1])[None]
            h = cp.model(inputs_embeds=cp.small_to_mtp_projection(x), past_key_values=pcache, use_cache=True,
                         cache_position=torch.arange(start, start + x.shape[1], device=dev)).last_hidden_state
            start += x.shape[1]
            frame_logits.append(cp.lm_head[g](h)[:, -1])  # upstream projects every position, keeps the last
            frame_hidden.append(h[:, -1])
        group_logits.append(frame_logits)
        hiddens.append(frame_hidden)
        if j + 1 < len(rec.codes):
            pos = n + j
            past = talker.model(inputs_embeds=_step_input(talker, codes, rec.text_for(j).to(dtype)),
                                attention_mask=torch.ones(1, pos + 1, dtype=torch.long, device=dev),
                                past_key_values=cache, use_cache=True,
                                cache_position=torch.tensor([pos], device=dev)).last_hidden_state
            talker_logits.append(talker.codec_head(past)[:, -1])
    return _collect(talker_logits, group_logits, hiddens, cp, ks)


class _Runner:
    """Runs a step op by op ("lean"), or captured once per key in a CUDA graph and replayed
    ("graphs", "fused"). A step reads only buffers that the caller refills before each run."""

    def __init__(self, mode: str):
        self.mode = mode
        self.entries = {}
        self.pool = torch.cuda.graph_pool_handle() if mode in runner.FAST_MODES else None

    def __call__(self, key, step):
        if self.mode == "lean":
            return step()
        if key not in self.entries:
            self.entries[key] = graphs.capture(step, self.pool)
        return tuple(t.clone() for t in self.entries[key].replay())  # the next replay overwrites them


def _cache_pairs(cache):
    """(keys, values) per layer of an HF DynamicCache, on transformers 4.57 and 5.x."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def lean_stack(talker, rec: Recording, ks, dtype, mode: str, overrides: dict | None = None) -> Logits:
    """The lean layers, teacher forced: upstream's prefill, then lean talker steps on static KV
    buffers and lean predictor passes. `overrides` replaces morph.decode.lean functions by name for the
    run (a deliberately worse rms_norm, say), to check that the gate catches it."""
    cp = talker.code_predictor
    dev = rec.prompt.device
    run = _Runner(mode)
    with ExitStack() as stack, torch.inference_mode():
        if overrides:
            stack.enter_context(mock.patch.multiple(lean, **overrides))
        t_stack = lean.FusedStack(talker.model.layers, talker.model.norm, talker.config)
        p_stack = lean.FusedStack(cp.model.layers, cp.model.norm, cp.config)
        stack.callback(t_stack.release)
        stack.callback(p_stack.release)
        tw, pw, td, pd = t_stack.weights(), p_stack.weights(), t_stack.dims, p_stack.dims
        proj = cp.small_to_mtp_projection
        proj_w, proj_b = (proj.weight, proj.bias) if isinstance(proj, torch.nn.Linear) else (None, None)

        cache, logits, past = _prefill(talker, rec, dtype)
        n = rec.prompt.shape[1]
        cap = n + len(rec.codes)
        tk = [torch.zeros(1, td.kv_heads, cap, td.head_dim, device=dev, dtype=dtype) for _ in tw]
        tv = [torch.zeros(1, td.kv_heads, cap, td.head_dim, device=dev, dtype=dtype) for _ in tw]
        for (k, v), kc, vc in zip(_cache_pairs(cache), tk, tv):
            kc[:, :, :n].copy_(k)
            vc[:, :, :n].copy_(v)
        t_cos, t_sin = lean.rope_tables(talker.model.rotary_emb, cap, dev, dtype, multimodal=True)
        slot = torch.zeros(1, dtype=torch.long, device=dev)
        no_pads = torch.zeros(1, dtype=torch.long, device=dev)
        t_in = torch.zeros(1, 1, talker.config.hidden_size, device=dev, dtype=dtype)

        plen = len(cp.lm_head) + 1  # a 2-token prefill, then one slot per later group
        pk = [torch.zeros(1, pd.kv_heads, plen, pd.head_dim, device=dev, dtype=dtype) for _ in pw]
        pv = [torch.zeros(1, pd.kv_heads, plen, pd.head_dim, device=dev, dtype=dtype) for _ in pw]
        p_cos, p_sin = lean.rope_tables(cp.model.rotary_emb, plen, dev, dtype, multimodal=False)
        no_lo = torch.zeros(1, dtype=torch.long, device=dev)
        idx = [torch.arange(2, device=dev)] + [torch.tensor([g + 1], device=dev) for g in range(1, 15)]
        p_in = [torch.zeros(1, 2, talker.config.hidden_size, device=dev, dtype=dtype)] + \
            [torch.zeros(1, 1, talker.config.hidden_size, device=dev, dtype=dtype) for _ in range(1, 15)]
        talker_fn, pass_fn = lean.talker_pass, lean.predictor_pass
        fused = mode == "fused"

        def predictor_step(g):
            h = pass_fn(p_in[g], proj_w, proj_b, pw, cp.model.norm.weight, pk, pv, p_cos, p_sin, idx[g], no_lo,
                        pd, fused)[:, -1]
            return h, F.linear(h, cp.lm_head[g].weight)

        def talker_step():
            h = talker_fn(t_in, tw, talker.model.norm.weight, tk, tv, t_cos, t_sin, slot, slot, no_pads, td, fused)
            return h, F.linear(h[:, -1], talker.codec_head.weight)

        talker_logits, group_logits, hiddens = [logits], [], []
        for j, codes in enumerate(rec.codes):
            frame_logits, frame_hidden = [], []
            for g in range(15):
                p_in[g].copy_(torch.cat((past, F.embedding(codes[:1], talker.model.codec_embedding.weight)[None]), 1)
                              if g == 0 else F.embedding(codes[g:g + 1], cp.model.codec_embedding[g - 1].weight)[None])
                h, lg = run(("predictor", g), lambda: predictor_step(g))
                frame_logits.append(lg)
                frame_hidden.append(h)
            group_logits.append(frame_logits)
            hiddens.append(frame_hidden)
            if j + 1 < len(rec.codes):
                t_in.copy_(_step_input(talker, codes, rec.text_for(j).to(dtype)))
                slot.fill_(n + j)
                past, lg = run(("talker",), talker_step)
                talker_logits.append(lg)
        return _collect(talker_logits, group_logits, hiddens, cp, ks)


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

        ref = timed(f"reference ({ref_dtype})", lambda rec: hf_stack(ref_model, rec, ks, ref_dtype))
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
