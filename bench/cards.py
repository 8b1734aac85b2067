"""The card table (README, docs/performance.md): the realistic script rendered as a front end renders it, with
the process held to what a card of each size leaves it.

For each card size (GiB) a fresh process caps what torch may allocate at the card less the 1 GiB the README tells
users to keep (`torch.cuda.set_per_process_memory_fraction`, checked there by asking for more than that), loads the
model, and renders the 256-line script of bench.common.script_lines (1-15 s lines, each row ending at its own
frame) through BatchTTS.render, the Python API's and the nodes' path, at each batch size, largest first, on the
engine's continuous batch (what every mode but eager renders on; the cards run the GPU's default mode). A render
that ran out of memory and retried at half the batch (render's warning), or failed, is recorded as such, and one the
engine built narrower because the free memory would not hold the batch asked for (`narrowed`) too:
the advised batch size of a card is the largest that rendered with no retry. `--renders N` renders N times in a row
at each size, the engine's state kept between them, as a user's session does. The weights count against the cap, as
they do on the card.

    python -m bench.cards --model /tmp/model-0.6b --cards 8,12,16,24 --batch-sizes 64,32,16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time

import torch

from bench.common import HELD_FRAMES, add_model_args, emit, load_bench_model, run_info, script_lines
from bench.sentences import reference_wave
from bench.workload import eos_held, sync
from morph.render import BatchTTS, Line
from morph.settings import FRAMES_PER_SECOND, SAMPLE_RATE, GenerationSettings

KEPT_GIB = 1  # what the README tells users to leave for CUDA and ComfyUI


class _Retries(logging.Handler):
    """A render's out-of-memory retries, as morph/render.py and the engine log them (`seen`), and the engine's
    narrowing of a batch to what the free memory holds before it runs (`narrowed`: no retry, no time lost)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen: list[str] = []
        self.narrowed: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "out of GPU memory" in message:
            self.seen.append(message)
        elif "GPU memory is free" in message:
            self.narrowed.append(message)


def cap_memory(card_gib: float) -> float:
    """Hold this process to a card of card_gib less KEPT_GIB; returns the cap in GiB after checking that the
    allocator refuses more."""
    cap = (card_gib - KEPT_GIB) * 2**30
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
    try:
        torch.empty(int(cap) + 2**28, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        return cap / 2**30
    raise RuntimeError(f"bench.cards: the allocator did not hold this process to {cap / 2**30:.1f} GiB")


def timed_render(tts, batch, lines, settings, size: int, render: int, weights: int, retries: _Retries) -> dict:
    """One render of the script at batch `size` (the `render`th in a row at that size): its time, its peak above the
    weights, and any retry or narrowing it logged; an error in place of those where it failed outright."""
    retries.seen.clear()
    retries.narrowed.clear()
    torch.cuda.reset_peak_memory_stats()
    row = dict(batch_size=size, render=render)
    try:
        sync(tts.device)
        start = time.perf_counter()
        audio = batch.render(lines, settings, batch_size=size)
        sync(tts.device)
        wall = time.perf_counter() - start
        seconds = sum(a.size for a in audio) / SAMPLE_RATE
        row.update(wall_s=round(wall, 3), x_real_time=round(seconds / wall, 1),
                   peak_above_weights_gib=round((torch.cuda.max_memory_allocated() - weights) / 2**30, 3),
                   reserved_gib=round(torch.cuda.memory_reserved() / 2**30, 3),
                   retried=list(retries.seen), narrowed=list(retries.narrowed), ran_as=tts.patch.last_run.get("mode"))
    except Exception as e:  # a render that fails outright: recorded, the next size still runs
        row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", retried=list(retries.seen))
    return row


def one_card(args, card_gib: float) -> dict:
    """This process as a card of card_gib: every batch size, largest first."""
    cap = cap_memory(card_gib)
    tts = load_bench_model(args)
    voice = tts.make_voice(reference_wave(), SAMPLE_RATE)
    ends = dict(script_lines(args.lines))
    lines = [Line(text, voice, "English") for text in ends]
    batch = BatchTTS(tts)
    batch.stop = lambda row: min(row.limit, ends[row.text])
    retries = _Retries()
    logging.getLogger("morph").addHandler(retries)
    weights = torch.cuda.memory_allocated()
    settings = eos_held(GenerationSettings(seq_groups=5, seed=0), HELD_FRAMES)
    rows = []
    for size in args.batch_sizes:
        tts.release_device_state()
        for render in range(1, args.renders + 1):  # in a row, the engine's state kept: what a user's session does
            rows.append(timed_render(tts, batch, lines, settings, size, render, weights, retries))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if "error" in rows[-1]:
                break
    clean = [size for size in args.batch_sizes
             if all("wall_s" in r and not r["retried"] for r in rows if r["batch_size"] == size)]
    return dict(card_gib=card_gib, cap_gib=round(cap, 2), weights_gib=round(weights / 2**30, 3),
                speech_frames=sum(ends.values()), speech_s=round(sum(ends.values()) / FRAMES_PER_SECOND, 1),
                advised_batch_size=max(clean) if clean else None, runs=rows)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--cards", default="8,12,16,24", help="comma list of card sizes, GiB")
    p.add_argument("--batch-sizes", default="64,32,16,8", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--lines", type=int, default=256)
    p.add_argument("--renders", type=int, default=1, help="renders in a row at each batch size, in one process")
    p.add_argument("--one", type=float, help=argparse.SUPPRESS)  # one card, in this process (a child of main)
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one_card(args, args.one)))
        return {}
    report = dict(run_info(torch.device("cuda")), model=args.model or f"random weights, {args.size} dims",
                  kept_gib=KEPT_GIB, lines=args.lines, mode="auto", seq_groups=5,
                  batching="continuous", cards=[])  # auto on a GPU: the engine (named as earlier reports name it)
    forwarded = list(argv if argv is not None else sys.argv[1:])
    for card in (float(c) for c in args.cards.split(",")):
        run = subprocess.run([sys.executable, "-m", "bench.cards", *forwarded, "--one", str(card)],
                             capture_output=True, text=True)
        got = run.stdout.strip().splitlines()
        if run.returncode == 0 and got:
            report["cards"].append(json.loads(got[-1]))
        else:  # the rows the child finished (it prints each as it ends) and the error that stopped it
            said = run.stderr.strip().splitlines()
            rows = [json.loads(line) for line in said if line.startswith('{"batch_size"')]
            report["cards"].append(dict(card_gib=card, runs=rows, error=said[-1] if said else f"exit {run.returncode}"))
        emit(report, args.json)
    return report


if __name__ == "__main__":
    main()
