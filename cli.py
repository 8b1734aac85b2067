"""The command line: `cli.py speak` (the default command) speaks a text in a cloned voice; render, voice and serve
live in cli_render.py, cli_voice.py and cli_serve.py. `python cli.py --help` lists them.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

from cli_common import (OUTPUT_DIR, SAVED_VOICE, CliError, Parser, Progress, add_generation_options,
                        add_model_options, check_language, check_model, check_output, check_voice_file, guarded,
                        is_saved_voice, load_base_model, read_clip, settings_from)
from morph.settings import SAMPLE_RATE

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_VOICE = ASSETS / "default_voice.wav"

COMMANDS = {  # name: (what it does, an example)
    "speak": ("speak a text in a cloned voice (the default command)",
              'python cli.py --text "Hello there." --voice me.wav --transcript "What me.wav says."'),
    "render": ("render a script: a WAV per line, the dialogue, subtitles",
               "python cli.py render scene1.txt --voice Alice=alice.wav --voice Bob=bob.safetensors"),
    "voice": ("save a voice cloned from a clip, for speak, render and serve",
              'python cli.py voice save bob.wav --transcript "What bob.wav says." --out output/voices/bob'),
    "serve": ("serve speech over HTTP, as OpenAI's /v1/audio/speech",
              "python cli.py serve --voices output/voices"),
}


def overview() -> str:
    """`cli.py --help`: what the CLI does, each command in a line with an example."""
    commands = "\n".join(f"  {name:<7} {what}\n    {example}" for name, (what, example) in COMMANDS.items())
    return ("usage: python cli.py COMMAND [options]    (speak when the first argument is an option)\n\n"
            "Clone a voice with Qwen3-TTS: a text and a short clip of the voice in, 24 kHz speech out.\n\n"
            f"commands:\n{commands}\n\n"
            "python cli.py COMMAND --help shows a command's options, --help-all all of them. Models are\n"
            "looked for in --models-dir and the Hugging Face cache, and downloaded when missing. What a\n"
            f"command writes by default goes under {OUTPUT_DIR}/ in the working folder.\n")


def build_parser() -> Parser:
    p = Parser(prog="cli.py speak", usage="python cli.py [speak] --text TEXT [--voice FILE] [options]",
               description="Speak a text in a cloned voice: a 24 kHz audio file.",
               epilog="examples:\n"
                      '  python cli.py --text "Hello there."                       # the bundled default voice\n'
                      '  python cli.py --text "Hello." --voice me.wav --transcript "What me.wav says."\n'
                      '  python cli.py --text "Hello." --voice bob.safetensors     # a saved voice\n')
    p.add_argument("--text", required=True, help="what to say; text over 500 characters is split at sentence ends")
    p.add_argument("--voice", type=Path, default=DEFAULT_VOICE,
                   help="the voice to clone: a clip (wav, flac, ogg or mp3; 3-10 s of clean speech) or a saved "
                        f"voice ({SAVED_VOICE}, from cli.py voice save); default: the bundled voice")
    p.add_argument("--transcript", default=None,
                   help="what the clip says (in-context cloning, the closest match); without it the voice is "
                        "x-vector only. With the bundled default voice, its transcript is the default")
    p.add_argument("--out", type=Path, default=OUTPUT_DIR / "out.wav",
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
    check_model(args)
    voice_path = check_voice_file(args.voice)
    out = check_output(args.out)
    settings = settings_from(args)
    transcript = args.transcript
    saved = is_saved_voice(voice_path)
    if saved and transcript is not None:
        raise CliError(f"--transcript: {voice_path.name} is a saved voice, which holds its own transcript (or none); "
                       "leave out --transcript")
    if transcript is None and args.voice == DEFAULT_VOICE:
        transcript = (ASSETS / "default_voice.txt").read_text(encoding="utf-8").strip()

    from morph.lines.text_split import MAX_SEGMENT_CHARS, split_text
    from morph.lines.words import FOR_CLI

    who = f"--voice {voice_path.name}"
    clip = None if saved else read_clip(voice_path, who, bool((transcript or "").strip()), FOR_CLI)

    import numpy as np
    import soundfile as sf

    from morph.lines.voice import load_voice
    from morph.qwen.quiet import quiet_third_party
    from postprocess import DEFAULT_CUTOFF_HZ, DEFAULT_PEAK_DBFS, lowpass, peak_normalize

    voice = load_voice(voice_path, who, FOR_CLI) if saved else None  # render reads a saved voice the same way
    segments = len(split_text(text)) if len(text) > MAX_SEGMENT_CHARS else 1
    tts = load_base_model(args)
    tts.ready(1, who="cli.py")  # compiles and captures now, said as such, not inside the line's own time
    if voice is None:
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


def unknown_command(word: str) -> str:
    """What `cli.py WORD` says when WORD is neither an option nor a command."""
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if close:
        what, example = COMMANDS[close[0]]
        return f"error: unknown command {word!r}; did you mean {close[0]}? ({what}: {example})"
    return f"error: unknown command {word!r}; the commands are {', '.join(COMMANDS)}: python cli.py --help"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in ([], ["-h"], ["--help"], ["--help-all"]):
        print(overview(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = (argv[0], argv[1:]) if not argv[0].startswith("-") else ("speak", argv)
    if command == "speak":
        return guarded(run, build_parser().parse_args(rest))
    if command == "render":  # a whole script
        from cli_render import main as render_main

        return render_main(rest)
    if command == "voice":  # a saved voice
        from cli_voice import main as voice_main

        return voice_main(rest)
    if command == "serve":  # an HTTP server
        from cli_serve import main as serve_main

        return serve_main(rest)
    print(unknown_command(command), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
