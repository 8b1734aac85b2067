"""Speak text in a cloned voice: text (+ reference clip) in, 24 kHz wav out; `cli.py render` renders a whole script
(cli_render.py), `cli.py voice save` makes a saved voice (cli_voice.py), `cli.py serve` serves speech over HTTP
(cli_serve.py).

    python cli.py --text "Hello there."                       # the bundled default voice
    python cli.py --text "Hello." --voice me.wav --transcript "What I say in me.wav."

Every input is checked before the model loads; hub models are looked for in --models-dir and the
Hugging Face cache, and downloaded into --models-dir when missing.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

from cli_common import (CliError, HelpFormatter, Progress, add_generation_options, add_model_options, check_language,
                        check_output, check_voice_file, guarded, load_base_model, read_clip, settings_from)
from morph.settings import SAMPLE_RATE

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_VOICE = ASSETS / "default_voice.wav"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cli.py", description=__doc__, formatter_class=HelpFormatter,
                                epilog="A whole script: python cli.py render --help; a saved voice: python cli.py "
                                       "voice --help; an HTTP server: python cli.py serve --help")
    p.add_argument("--text", required=True, help="what to say; text over 500 characters is split at sentence ends")
    p.add_argument("--voice", type=Path, default=DEFAULT_VOICE,
                   help="reference clip of the voice to clone (wav, flac, ogg or mp3, any rate, mono or stereo; "
                        "3-10 s of clean speech); default: the bundled voice, assets/default_voice.wav")
    p.add_argument("--transcript", default=None,
                   help="what the reference clip says (in-context cloning, the closest match); without it the "
                        "voice is x-vector only. With the bundled default voice, its transcript is the default")
    p.add_argument("--out", type=Path, default=Path("out.wav"),
                   help="audio file to write (its folder is created; .wav is added when it has no extension)")
    add_model_options(p)
    add_generation_options(p, seed_help="random seed: the same seed, text and options give the same audio on "
                                        "the same machine; without it every run is a new take")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_text(text: str) -> str:
    if not text.strip():
        raise CliError("--text is empty; give the words to speak")
    return text.strip()


# -- the main job ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    text = check_text(args.text)
    language = check_language(args.language)
    voice_path = check_voice_file(args.voice)
    out = check_output(args.out)
    settings = settings_from(args)
    transcript = args.transcript
    if transcript is None and args.voice == DEFAULT_VOICE:
        transcript = (ASSETS / "default_voice.txt").read_text(encoding="utf-8").strip()

    from morph.lines.text_split import MAX_SEGMENT_CHARS, split_text
    from morph.lines.words import FOR_CLI

    clip = read_clip(voice_path, f"--voice {voice_path.name}", bool((transcript or "").strip()), FOR_CLI)

    import numpy as np
    import soundfile as sf

    from morph.qwen.quiet import quiet_third_party
    from postprocess import DEFAULT_CUTOFF_HZ, DEFAULT_PEAK_DBFS, lowpass, peak_normalize

    segments = len(split_text(text)) if len(text) > MAX_SEGMENT_CHARS else 1
    tts = load_base_model(args)
    voice = tts.voice_from_clip(clip, transcript, who="--voice")
    print(f"speaking {len(text)} characters in {segments} segment{'s' if segments != 1 else ''} on {tts.device}"
          + (f" (--max-new-tokens {args.max_new_tokens} applies to each segment)" if segments > 1
             and args.max_new_tokens else ""), file=sys.stderr)
    progress = Progress(segments)
    start = time.perf_counter()
    with quiet_third_party():  # transformers' note on the repetition penalty, at the first generate
        audio = tts.clone(text, voice, language, settings, on_step=progress, who="cli.py", words=FOR_CLI)
    progress.finish()
    took = time.perf_counter() - start
    if not args.no_smooth:
        audio = peak_normalize(lowpass(audio, SAMPLE_RATE, DEFAULT_CUTOFF_HZ), DEFAULT_PEAK_DBFS)
    out.parent.mkdir(parents=True, exist_ok=True)  # checked writable before the load, made only now
    sf.write(str(out), np.asarray(audio, dtype=np.float32), SAMPLE_RATE)
    seconds = len(audio) / SAMPLE_RATE
    print(f"wrote {out}: {seconds:.2f} s of audio in {took:.2f} s ({seconds / max(took, 1e-9):.2f}x real time)")
    return 0


COMMANDS = {"render": "render a script: python cli.py render SCRIPT --voice NAME=FILE ...",
            "voice": "make a saved voice: python cli.py voice save CLIP --transcript TEXT --out NAME.safetensors",
            "serve": "serve speech over HTTP (OpenAI-compatible): python cli.py serve --model MODEL"}


def unknown_command(word: str) -> str:
    """What `cli.py WORD` says when WORD is neither an option nor a command (argparse alone would ask for --text)."""
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if close:
        return f"error: unknown command {word!r}; did you mean {close[0]}? ({COMMANDS[close[0]]})"
    return (f"error: unknown command {word!r}; speak a text with python cli.py --text \"...\", "
            + "; ".join(COMMANDS.values()))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["render"]:  # a whole script: cli_render.py
        from cli_render import main as render_main

        return render_main(argv[1:])
    if argv[:1] == ["voice"]:  # a saved voice: cli_voice.py
        from cli_voice import main as voice_main

        return voice_main(argv[1:])
    if argv[:1] == ["serve"]:  # an HTTP server: cli_serve.py
        from cli_serve import main as serve_main

        return serve_main(argv[1:])
    if argv and not argv[0].startswith("-"):
        print(unknown_command(argv[0]), file=sys.stderr)
        return 2
    return guarded(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
