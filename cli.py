"""Speak text in a cloned voice: text (+ reference clip) in, 24 kHz wav out.

    python cli.py --text "Hello there."                       # the bundled default voice
    python cli.py --text "Hello." --voice me.wav --transcript "What I say in me.wav."
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from morph.engine import MorphTTS
from morph.loading import DEFAULT_MODEL
from morph.sampling import Sampling
from morph.settings import DEFAULT_SEQ_GROUPS, MAX_SEQ_GROUPS, SAMPLE_RATE, GenerationSettings
from postprocess import DEFAULT_CUTOFF_HZ, DEFAULT_PEAK_DBFS, lowpass, peak_normalize

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_VOICE = ASSETS / "default_voice.wav"
DEFAULT_MODELS_DIR = Path("models") / "qwen3-tts"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", required=True, help="what to say")
    p.add_argument("--voice", type=Path, default=DEFAULT_VOICE, help="reference clip of the voice to clone")
    p.add_argument("--transcript", default=None,
                   help="what the reference clip says (enables ICL mode); without it, x-vector only. "
                        "Defaults to the bundled clip's transcript when --voice is not given")
    p.add_argument("--out", type=Path, default=Path("out.wav"), help="wav file to write")
    p.add_argument("--model", default=DEFAULT_MODEL, help="local checkpoint folder or hub id")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR,
                   help="where hub models are looked for and downloaded")
    p.add_argument("--language", default="Auto")
    p.add_argument("--seq-groups", type=int, default=DEFAULT_SEQ_GROUPS,
                   help=f"code groups decoded sequentially (1..{MAX_SEQ_GROUPS}); {MAX_SEQ_GROUPS} is upstream-exact")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--greedy", action="store_true", help="no sampling anywhere (deterministic)")
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.05)
    p.add_argument("--max-new-tokens", type=int, default=None, help="frame limit (default: bounded by text length)")
    p.add_argument("--no-smooth", action="store_true", help="skip the low-pass and peak normalisation")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flash_attention_2", "eager"])
    return p.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    transcript = args.transcript
    if transcript is None and args.voice == DEFAULT_VOICE:
        transcript = (ASSETS / "default_voice.txt").read_text(encoding="utf-8").strip()

    tts = MorphTTS.load(args.model, args.device, args.dtype, args.attention,
                        search_dirs=[args.models_dir], download_dir=args.models_dir)
    waveform, sr = sf.read(str(args.voice), dtype="float32", always_2d=True)
    voice = tts.make_voice(waveform.T, sr, transcript, who="cli --voice")
    settings = GenerationSettings(
        seq_groups=args.seq_groups, do_sample=not args.greedy, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, repetition_penalty=args.repetition_penalty,
        subtalker=Sampling(not args.greedy, args.temperature, args.top_k, args.top_p),
        seed=args.seed, max_new_tokens=args.max_new_tokens,
    )
    start = time.perf_counter()
    audio = tts.clone(args.text, voice, args.language, settings, who="cli")
    took = time.perf_counter() - start
    if not args.no_smooth:
        audio = peak_normalize(lowpass(audio, SAMPLE_RATE, DEFAULT_CUTOFF_HZ), DEFAULT_PEAK_DBFS)
    sf.write(str(args.out), np.asarray(audio, dtype=np.float32), SAMPLE_RATE, subtype="PCM_16")
    seconds = len(audio) / SAMPLE_RATE
    print(f"wrote {args.out}: {seconds:.2f} s of audio in {took:.2f} s ({seconds / max(took, 1e-9):.2f}x real time)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError, RuntimeError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
