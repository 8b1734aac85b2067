"""The lines a benchmark renders: how many, how long, in which voices (bench.batch's and bench.memory_map's)."""

from __future__ import annotations

from bench.common import mixed_texts, script_lines, skewed_lines
from bench.sentences import SENTENCES, reference_wave
from bench.workload import REF_TEXT
from morph.render import BatchTTS, Line


def script(n: int) -> list[str]:
    return [SENTENCES[i % len(SENTENCES)] for i in range(n)]


def add_line_args(p) -> None:
    """The arguments bench_lines reads: how many lines, how long, in which voices."""
    p.add_argument("--lines", type=int, default=32)
    p.add_argument("--frames", type=int, default=62, help="frames per line (12.5 a second; 62 is about 5 s)")
    p.add_argument("--lengths", default="uniform", choices=["uniform", "mixed", "script", "skewed"],
                   help="uniform: every line --frames long; mixed: each row ending at its text-derived limit "
                        "(about 5.4 to 15.2 s); script: a realistic script, 1-15 s lines each ending at its own "
                        "frame, not where its text length says (bench.common.script_lines); skewed: a minute-long "
                        "line in every 64 among 1-5 s ones (bench.common.skewed_lines); --frames is ignored but "
                        "for uniform")
    p.add_argument("--prompts", default="mixed", choices=["mixed", "xvector", "icl"],
                   help="voices of the lines: x-vector and ICL alternating, or all one kind")


def bench_lines(tts, args) -> tuple[BatchTTS, list[Line], dict, int | None]:
    """(the batch front end, the lines, {text: the frame its row ends at} (script and skewed lengths), the frames
    every line is held to (uniform lengths, else None)) for add_line_args's arguments; the voices made here."""
    voices = {"xvector": tts.make_voice(reference_wave(), 24000),
              "icl": tts.make_voice(reference_wave(), 24000, REF_TEXT)}
    kinds = ["xvector", "icl"] if args.prompts == "mixed" else [args.prompts]
    ends = dict({"script": script_lines, "skewed": skewed_lines}[args.lengths](args.lines)) \
        if args.lengths in ("script", "skewed") else {}
    texts = (list(ends) if ends else mixed_texts(args.lines) if args.lengths == "mixed" else script(args.lines))
    lines = [Line(text, voices[kinds[i % len(kinds)]], "English") for i, text in enumerate(texts)]
    batch = BatchTTS(tts)
    if ends:  # random weights never stop on their own: each row ends where its speech would (EOS held back before)
        batch.stop = lambda row: min(row.limit, ends[row.text])
    return batch, lines, ends, args.frames if args.lengths == "uniform" else None
