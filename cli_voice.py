"""Saved voices from the command line: `cli.py voice save` clones a voice from a clip into a .safetensors file (the
file ComfyUI's Save Voice node writes, which `cli.py render --voice NAME=FILE.safetensors` and Load Voice read), and
`cli.py voice info` says what such a file holds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from cli_common import (SAVED_VOICE, CliError, Parser, add_model_options, check_model, check_voice_file,
                        check_writable, guarded, load_base_model, read_clip)
from morph.lines.words import FOR_CLI, model_size_name
from morph.settings import FRAMES_PER_SECOND

SUFFIX = SAVED_VOICE
EXAMPLES = """examples:
  python cli.py voice save bob.wav --transcript "What bob.wav says." --out output/voices/bob.safetensors
  python cli.py voice save bob.wav --out output/voices/bob     # x-vector only; writes output/voices/bob.safetensors
  python cli.py voice info output/voices/bob.safetensors
  python cli.py render scene1.txt --voice Bob=output/voices/bob.safetensors ...
"""
# prepare_reference's fixes, in this command's words: the clip is the positional CLIP, not render's --voice
SAVE_WORDS = dataclasses.replace(FOR_CLI, new_clip="give another recording of the voice to clone as CLIP",
                                 no_transcript="leave out --transcript (or add --x-vector-only)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="cli.py voice", description=__doc__, epilog=EXAMPLES)
    commands = p.add_subparsers(dest="command", required=True, metavar="{save,info}")

    save = commands.add_parser("save", help="clone a voice from a clip into a .safetensors file",
                               usage="python cli.py voice save CLIP --out NAME.safetensors [options]",
                               description="Clone a voice from CLIP into a .safetensors file, the one ComfyUI's Save "
                                           "Voice node writes.\nCLIP and --out are checked before the model loads.",
                               epilog=EXAMPLES)
    save.add_argument("clip", type=Path, metavar="CLIP",
                      help="reference clip of the voice (wav, flac, ogg or mp3, any rate, mono or stereo; 3-10 s of "
                           "clean speech works best)")
    save.add_argument("--transcript", default=None, metavar="TEXT",
                      help="what CLIP says: an in-context (ICL) voice, the closest match; without it the voice is "
                           "x-vector only (the speaker embedding alone)")
    save.add_argument("--x-vector-only", action="store_true",
                      help="an x-vector-only voice even with --transcript: less faithful, but never leaks the clip's "
                           "words (a --transcript is still kept in the file)")
    save.add_argument("--out", type=Path, required=True, metavar="NAME.safetensors",
                      help="the voice file to write (.safetensors is added when it has no extension; its folder is "
                           "created)")
    save.add_argument("--force", action="store_true", help="overwrite --out when it exists")
    add_model_options(save)
    save.set_defaults(job=save_voice_file)

    info = commands.add_parser("info", help="what a saved voice file holds",
                               description="Say what a saved voice file holds: the model size it works with, ICL or "
                                           "x-vector only,\nits transcript and the length of its reference.",
                               epilog=EXAMPLES)
    info.add_argument("file", type=Path, metavar="FILE.safetensors", help="a voice file from cli.py voice save or "
                                                                          "ComfyUI's Save Voice")
    info.set_defaults(job=voice_info)
    return p


# -- voice save ---------------------------------------------------------------------------------------
def check_out(path: Path, force: bool) -> Path:
    """The voice file to write: .safetensors added when there is no extension, not an existing file unless --force,
    in a folder that can be made and written. Nothing is created here."""
    if not path.suffix:
        path = path.with_suffix(SUFFIX)
    elif path.suffix.lower() != SUFFIX:  # render reads a --voice as a saved voice by this suffix
        raise CliError(f"--out: a saved voice is a {SUFFIX} file, not {path.suffix}; give e.g. "
                       f"{path.with_suffix(SUFFIX)}")
    if path.is_dir():
        raise CliError(f"--out: {path} is a folder; give a file name such as {path / ('voice' + SUFFIX)}")
    if path.exists() and not force:
        raise CliError(f"--out: {path} exists; add --force to overwrite it, or give another --out")
    check_writable(path.parent, "--out")
    return path


def save_voice_file(args: argparse.Namespace) -> int:
    check_model(args)
    clip_path = check_voice_file(args.clip, "CLIP", saved=False)
    out = check_out(args.out, args.force)
    transcript = (args.transcript or "").strip() or None
    clip = read_clip(clip_path, f"CLIP {clip_path.name}", bool(transcript) and not args.x_vector_only, SAVE_WORDS)
    tts = load_base_model(args)
    voice = tts.voice_from_clip(clip, transcript, args.x_vector_only, who="cli.py voice save")
    write_whole(voice, out)
    kind = "an ICL voice" if voice.icl else "an x-vector-only voice"
    print(f"wrote {out}: {kind} for {model_size_name(voice.model_size)} Base models, "
          + (f"transcript {voice.ref_text!r}" if voice.ref_text else "no transcript"))
    return 0


def write_whole(voice, out: Path) -> None:
    """save_voice into a temporary file beside `out`, renamed over it: a failed or stopped write keeps an existing
    voice (--force) and leaves no part of a file, and the folders it made go again."""
    from morph.lines.voice import save_voice

    made = [f for f in (out.parent, *out.parent.parents) if not f.exists()]  # deepest first
    part = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        save_voice(voice, part)  # makes the folders
        os.replace(part, out)
    except BaseException as e:
        part.unlink(missing_ok=True)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty: something else is in it now
                break
        if isinstance(e, OSError):  # the OS's words alone name neither the file nor what to do
            raise CliError(f"--out: could not write {out} ({e.strerror or e}); check the folder's permissions and "
                           "free space, or give another --out") from e
        raise


# -- voice info ---------------------------------------------------------------------------------------
def voice_info(args: argparse.Namespace) -> int:
    from morph.lines.voice import load_voice  # torch, for the tensors; nothing of the model

    voice = load_voice(args.file, who="cli.py voice info", words=FOR_CLI)
    size = model_size_name(voice.model_size)
    lines = [f"{args.file}: a saved Qwen3-TTS voice",
             f"  works with:  {size} Base models (hidden size {voice.hidden_size})",
             "  mode:        " + ("ICL (in-context cloning: the speaker embedding and the reference's codes)"
                                  if voice.icl else "x-vector only (the speaker embedding alone)"),
             f"  transcript:  {voice.ref_text!r}" if voice.ref_text else "  transcript:  none"]
    if voice.icl:
        frames = int(voice.ref_code.shape[0])
        lines.append(f"  reference:   {frames / FRAMES_PER_SECOND:.2f} s ({frames} codec frames)")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    if argv is not None and not argv:  # `cli.py voice` alone: what it does
        print(parser.format_help(), file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    return guarded(args.job, args)
