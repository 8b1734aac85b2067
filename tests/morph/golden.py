"""The continuous path's golden codes: what the tiny model (CPU, fp32, mode "lean") gives for a fixed set of scripts,
recorded once and held by tests/morph/test_golden_codes.py through every change that is not meant to change a take.

Each case is a script of lines in two voices (an x-vector one and an ICL one) and two languages, some texts said in
both voices and both languages, each row ending at a frame of its own (as speech ends at EOS), run `width` rows at a
time: one row, 8 and 64 at once, and 24 through 3 slots so that rows join as others end. Greedy cases and seeded
ones (each row its own random stream, keyed by the seed, its text, voice and language).

    python -m tests.morph.golden --write     # record tests/fixtures/golden_codes.npz again

Record again only for a change that is meant to change the codes, and say in its commit which and why.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "golden_codes.npz"
SR = 24000
FRAMES = 16  # every row's limit
SEED = 7
WORDS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen".split()


@dataclass(frozen=True)
class Case:
    rows: int
    width: int
    seeded: bool

    def settings(self) -> GenerationSettings:
        return GenerationSettings(seq_groups=5, do_sample=self.seeded, subtalker=Sampling(do_sample=self.seeded),
                                  max_new_tokens=FRAMES, seed=SEED if self.seeded else None)


CASES = {f"{kind}-{name}": Case(rows, width, kind == "seeded")
         for kind in ("greedy", "seeded")
         for name, rows, width in (("1", 1, 1), ("8", 8, 8), ("64", 64, 64), ("joins", 24, 3))}


def voices(tts) -> dict:
    """An x-vector voice and an ICL one from one clean two-second clip (tests/morph/conftest.py's `voices` too), both
    with one fixed speaker embedding in place of the encoder's. A seeded row's random stream is keyed by its voice's
    bytes (morph/lines/line.py Line.identity), and the encoder's last bits follow the CPU's kernels and its thread
    count (two threads and one gave different x-vectors here), so the encoder's own would tie the recorded codes to
    the machine that recorded them. The ICL voice's reference codes are the codec's (integers: the same on each)."""
    t = np.arange(2 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    made = {"xvec": tts.make_voice(wave, SR), "icl": tts.make_voice(wave, SR, transcript="A short reference sentence.")}
    shape = made["xvec"].spk_embedding.shape
    fixed = 0.1 * torch.randn(shape, generator=torch.Generator().manual_seed(SEED), dtype=torch.float32)
    return {name: dataclasses.replace(voice, spk_embedding=fixed) for name, voice in made.items()}


def lines(case: Case, voice: dict) -> list[Line]:
    """Texts of 1 to 14 words, lines 2j and 2j + 1 saying one text: lines 0 and 1 in two voices, 4 and 5 in one voice
    and two languages."""
    return [Line(" ".join(WORDS[:1 + (i // 2 * 5) % len(WORDS)]) + ".", voice["icl" if i % 3 == 0 else "xvec"],
                 "Chinese" if i % 6 == 5 else "English") for i in range(case.rows)]


def ends(case: Case) -> list[int]:
    """The frame row i ends at (its stop), 3 to FRAMES."""
    return [min(FRAMES, 3 + (7 * i + 9) % 14) for i in range(case.rows)]


def run(tts, case: Case, voice: dict) -> list[torch.Tensor]:
    """The case's codes [frames, 16] per line, through the continuous batch."""
    batch, stops = BatchTTS(tts), ends(case)
    batch.stop = lambda row: min(row.limit, stops[row.index])
    return batch.codes(lines(case, voice), case.settings(), batch_size=case.width)


def pack(codes: list[torch.Tensor]) -> np.ndarray:
    """[rows, FRAMES, 16] int16, -1 past a row's end."""
    out = np.full((len(codes), FRAMES, 16), -1, dtype=np.int16)
    for i, c in enumerate(codes):
        out[i, :c.shape[0]] = c.numpy()
    return out


def unpack(packed: np.ndarray) -> list[torch.Tensor]:
    return [torch.from_numpy(row[:int((row[:, 0] >= 0).sum())].astype(np.int64)) for row in packed]


def load() -> dict[str, list[torch.Tensor]]:
    with np.load(FIXTURE) as saved:
        return {name: unpack(saved[name]) for name in CASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"record {FIXTURE.name}")
    args = parser.parse_args()
    from bench.random_model import build_random_model
    from morph.api import MorphTTS

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_random_model(Path(tmp) / "tiny-base", "tiny", "base", seed=0)
        tts = MorphTTS.load(str(model), device="cpu", dtype="fp32", attention="sdpa")
        tts.patch.mode = "lean"
        voice = voices(tts)
        got = {}
        for name, case in CASES.items():
            torch.manual_seed(0)
            got[name] = pack(run(tts, case, voice))
            print(name, got[name].shape, int((got[name][:, :, 0] >= 0).sum()), "frames")
    if args.write:
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(FIXTURE, **got)
        print("wrote", FIXTURE)


if __name__ == "__main__":
    main()
