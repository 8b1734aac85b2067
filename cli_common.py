"""What the CLI's commands share: their parser, the model and generation options, the checks that need no model,
the progress line, model loading, and how an error or Ctrl-C ends a command.

Only the standard library and morph's torch-free modules are imported up here, so that --help and argument errors
answer at once; numpy, torch and qwen-tts come in after the arguments parse.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from morph.lines.words import Words
from morph.progress import Cadence, clock
from morph.qwen.checkpoints import DEFAULT_MODEL, LANGUAGES, check_source
from morph.settings import DEFAULT_SEQ_GROUPS, MAX_SEQ_GROUPS, GenerationSettings, Sampling

if TYPE_CHECKING:
    import numpy as np

ROOT = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = ROOT / "models" / "qwen3-tts"
MODELS_DIR_ENV = "QWEN3TTS_MODELS_DIR"  # the nodes' fallback folder too (nodes/services.py)
# Where every file the CLI writes by default goes, in the working folder: one place to find them, and in a clone a
# folder its .gitignore lists, so that nothing made there shows as untracked.
OUTPUT_DIR = Path("output")
_ENGINE = GenerationSettings()  # the engine's defaults
DEFAULT_SAMPLING = dict(temperature=_ENGINE.temperature, top_k=_ENGINE.top_k, top_p=_ENGINE.top_p,
                        repetition_penalty=_ENGINE.repetition_penalty)


class CliError(Exception):
    """A bad input, reported as `error: ...` with exit status 2 and no traceback."""


# The engine names settings as fields; here they are flags.
_FLAGS = re.compile(r"\b(seq_groups|temperature|top_k|top_p|repetition_penalty|max_new_tokens)\b")


def as_flags(message: str) -> str:
    return _FLAGS.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default said once and truly: argparse's '(default: X)' only where the help does not say it
    already and there is a default to say (not on a required option, a switch, or one whose default is None or
    empty); the description keeps its own line breaks, so a command's examples read as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text, default = action.help or "", action.default
        if (action.required or not action.option_strings or default in (None, False, [], argparse.SUPPRESS)
                or "default" in text):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """A command's options: no abbreviations (`--batch` is not taken for `--batch-size`), a "did you mean" for a
    mistyped option, command or choice, errors in one line, and a help that fits a screen: the options added to
    `more()` show with --help-all only."""

    def __init__(self, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(allow_abbrev=False, **kwargs)
        self._help_all = self.add_argument("--help-all", action=_HelpAll, nargs=0,
                                           help="show every option, those this help leaves out too")
        self._more: argparse._ArgumentGroup | None = None

    def more(self) -> argparse._ArgumentGroup:
        """The group of options that only --help-all shows."""
        if self._more is None:
            self._more = self.add_argument_group("more options")
        return self._more

    def format_help(self, everything: bool = False) -> str:
        if self._more is None:  # nothing left out: no --help-all to offer
            hidden = [self._help_all]
        else:
            hidden = [] if everything else self._more._group_actions
        helps = [action.help for action in hidden]
        for action in hidden:
            action.help = argparse.SUPPRESS
        try:
            text = super().format_help()
        finally:
            for action, help_text in zip(hidden, helps):
                action.help = help_text
        return text + (f"\n{len(hidden)} more options: python {self.prog} --help-all\n" if self._more and hidden
                       else "")

    def parse_args(self, args=None, namespace=None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(self._unknown(extra[0], parsed))
        return parsed

    def parse_known_args(self, args=None, namespace=None):
        self._given = sys.argv[1:] if args is None else list(args)  # for `error`: a typo beats a missing option
        return super().parse_known_args(args, namespace)

    def _unknown(self, word: str, parsed: argparse.Namespace | None) -> str:
        """What to say of an argument no option took: the options it may have meant (of the command it came to)."""
        parser = self
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                parser = action.choices.get(getattr(parsed, action.dest, None), self)
        if not word.startswith("--"):
            return f"unexpected argument {word!r}"
        flag = word.partition("=")[0]
        # a retired option (its help suppressed) is still taken, never suggested
        options = [o for o, a in parser._option_string_actions.items() if a.help is not argparse.SUPPRESS]
        meant = [option for option in options if option.startswith(flag)] or \
            difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
        return f"unknown option {flag}" + (f"; did you mean {' or '.join(meant[:3])}?" if meant else "")

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is None or value in action.choices:
            return
        choices = [str(choice) for choice in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        fix = f"did you mean {close[0]}?" if close else f"choose from {', '.join(choices)}"
        if isinstance(action, argparse._SubParsersAction):  # `cli.py voice sve`: said as the command typed
            command = self.prog.partition(" ")[2]
            raise argparse.ArgumentError(None, f"unknown command '{command} {value}'; " + fix.replace(
                "mean ", f"mean {command} "))
        raise argparse.ArgumentError(action, f"invalid choice {value!r}; {fix}")

    def error(self, message: str):
        if message.startswith("the following arguments are required"):  # `--txt Hi`: said as the typo it is
            typos = [word for word in getattr(self, "_given", []) if word.startswith("--")
                     and word.partition("=")[0] not in self._option_string_actions]
            message = self._unknown(typos[0], None) if typos else message
        message = message.removeprefix("argument ")
        if "did you mean" not in message:
            message += f"; python {self.prog} --help lists the options"
        self.exit(2, f"error: {message}\n")


class _HelpAll(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(parser.format_help(everything=True), sys.stdout)
        parser.exit()


def add_model_options(p: Parser) -> None:
    """--model and --device; where models are kept, the precision and the attention kernel under --help-all."""
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="a checkpoint folder, a folder name in --models-dir, or a hub id")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu", "mps"],
                   help="auto: CUDA if available, else the CPU")
    more = p.more()
    more.add_argument("--models-dir", type=Path, default=Path(os.environ.get(MODELS_DIR_ENV) or DEFAULT_MODELS_DIR),
                      help=f"where model folders are looked for, and where hub models are downloaded to; default: "
                           f"${MODELS_DIR_ENV}, else models/qwen3-tts in the pack's folder")
    more.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                      help="weight precision; auto is bf16 on GPUs that support it, fp32 on the CPU")
    more.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flash_attention_2", "eager"],
                      help="attention kernel; auto is flash-attention 2 when flash_attn imports, else sdpa")


def add_generation_options(p: Parser, seed_help: str, audio_out: bool = True) -> None:
    """The generation flags (--language and --seed shown, the sampling under --help-all); with audio_out also
    --language and --no-smooth, which the server takes per request (language) or does not do (smoothing: a stream
    cannot be normalised to its peak)."""
    if audio_out:
        p.add_argument("--language", default="Auto", help=f"language of the text: {', '.join(LANGUAGES)}")
    p.add_argument("--seed", type=int, default=None, help=seed_help)
    more = p.more()
    more.add_argument("--seq-groups", type=int, default=DEFAULT_SEQ_GROUPS,
                      help=f"code groups decoded one by one (1-{MAX_SEQ_GROUPS}); {MAX_SEQ_GROUPS} is closest to "
                           "upstream (bit-exact only in the Python API's eager mode, fp32), lower is faster")
    more.add_argument("--greedy", action="store_true", help="no sampling anywhere (deterministic, may loop or hum)")
    more.add_argument("--temperature", type=float, default=DEFAULT_SAMPLING["temperature"],
                      help="sampling temperature (talker and code predictor)")
    more.add_argument("--top-k", type=int, default=DEFAULT_SAMPLING["top_k"], help="top-k sampling; 0 is off")
    more.add_argument("--top-p", type=float, default=DEFAULT_SAMPLING["top_p"], help="top-p sampling; 1.0 is off")
    more.add_argument("--repetition-penalty", type=float, default=DEFAULT_SAMPLING["repetition_penalty"],
                      help="penalty on repeated talker tokens; 1.0 is none")
    more.add_argument("--max-new-tokens", type=int, default=None,
                      help="frame limit of each segment (12.5 frames a second); default: 5 s plus 0.35 s per "
                           "character of the segment")
    if audio_out:
        more.add_argument("--no-smooth", action="store_true",
                          help="skip the low-pass filter and the -3 dBFS normalisation")


def settings_from(args: argparse.Namespace) -> GenerationSettings:
    """The generation settings the flags give, checked, with messages that name the flags."""
    if args.seed is not None and args.seed < 0:
        raise CliError(f"--seed must be >= 0, got {args.seed}")
    sampling = Sampling(not args.greedy, args.temperature, args.top_k, args.top_p)
    settings = GenerationSettings(
        seq_groups=args.seq_groups, do_sample=not args.greedy, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, subtalker=sampling, seed=args.seed,
        max_new_tokens=args.max_new_tokens)
    try:
        return settings.validate("cli.py")
    except ValueError as e:
        raise CliError(as_flags(str(e).removeprefix("cli.py: "))) from e


# -- checks that need no model ---------------------------------------------------------------------
def check_language(language: str) -> str:
    for known in LANGUAGES:
        if known.lower() == language.strip().lower():
            return known
    raise CliError(f"--language {language!r} is not one of {', '.join(LANGUAGES)}")


def check_model(args: argparse.Namespace) -> None:
    """--model names a checkpoint folder that is there, or a hub id: a typo is answered at once, not after torch's
    import (seconds). Hub ids are looked up, or downloaded, when the model loads."""
    try:
        check_source(args.model, [args.models_dir])
    except FileNotFoundError as e:
        raise CliError(f"--model: {e}") from e


SAVED_VOICE = ".safetensors"  # a saved voice, as `cli.py voice save` and ComfyUI's Save Voice write it


def is_saved_voice(path: Path) -> bool:
    return path.suffix.lower() == SAVED_VOICE


def check_voice_file(path: Path, flag: str = "--voice", saved: bool = True) -> Path:
    """A voice file that exists: a saved voice (with `saved`; read with torch, when the model loads) or a clip that
    reads as audio. Messages name it as `flag` (the option or argument it came in)."""
    import soundfile as sf

    if not path.is_file():
        raise CliError(f"{flag}: file not found: {path}" + (" (it is a folder)" if path.is_dir() else ""))
    if saved and is_saved_voice(path):
        return path
    try:
        sf.info(str(path))
    except Exception as e:  # soundfile raises its own error types for unreadable files
        raise CliError(f"{flag}: cannot read {path} as audio ({e}); give a wav, flac, ogg or mp3 file") from e
    return path


def read_clip(path: Path, who: str, icl: bool, words: Words) -> np.ndarray:
    """A checked clip file prepared as the engine takes it (mono float32 at 24 kHz, morph/lines/reference_audio.py),
    before torch loads (seconds on a busy machine): a short or silent clip is refused at once. libsndfile scales
    integer PCM into [-1, 1) and returns float files' own values, peaks over 1.0 included."""
    import soundfile as sf

    from morph.lines.reference_audio import prepare_reference

    wave, rate = sf.read(str(path), dtype="float32", always_2d=True)  # [T, C]
    return prepare_reference(wave, rate, who, icl=icl, words=words)


def load_base_model(args: argparse.Namespace):
    """load_model for cloning a voice: --device checked first, then a Base model, or an error naming --model."""
    from morph.qwen.checkpoints import VARIANT_NAMES
    from morph.qwen.loading import resolve_device

    resolve_device(args.device)
    tts = load_model(args)
    if tts.variant != "base":
        raise CliError(f"--model: {args.model} is a {VARIANT_NAMES.get(tts.variant, tts.variant)} model; cloning a "
                       f"voice needs a Base model, such as {DEFAULT_MODEL} (the default)")
    return tts


def check_writable(folder: Path, flag: str) -> None:
    """That `folder` can be made and written into, found out without leaving anything behind: a temporary file goes
    into the nearest folder that exists and is removed again. The folders still missing are made only when the
    first file is written, so a run that fails or is stopped before leaves no empty folder."""
    import tempfile

    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(f"{flag}: cannot create the folder {folder}: {existing} is a file")
    # Tried, not asked: os.access says yes to root everywhere, /proc included, and a network or read-only
    # mount can refuse what the mode bits allow.
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-test-"):
            pass
    except OSError as e:
        raise CliError(f"{flag}: cannot write into {folder} ({e.strerror or e}); choose another place") from e


def check_output(path: Path) -> Path:
    """The file to write: .wav added when there is no extension, a format soundfile writes, in a folder that can be
    made and written. Checked now, not after the generation; nothing is created here."""
    import soundfile as sf

    if path.is_dir():
        raise CliError(f"--out: {path} is a folder; give a file name such as {path / 'out.wav'}")
    if not path.suffix:
        path = path.with_suffix(".wav")
    if path.suffix[1:].upper() not in sf.available_formats():
        raise CliError(f"--out: cannot write {path.suffix} files; use .wav (or .flac or .ogg)")
    if not path.parent.is_dir():
        check_writable(path.parent, "--out")
        return path
    existed = path.exists()
    try:  # the file itself, where its folder is there: a place may refuse a new file its folder's mode allows
        with open(path, "ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        raise CliError(f"--out: cannot write {path} ({e.strerror or e}); choose another place") from e
    return path


# -- progress ----------------------------------------------------------------------------------------
class ProgressLine:
    """One progress line on stderr. On a terminal: a bar redrawn in place, at most ten times a second, and once more
    at `finish` with the final counts. Elsewhere (a log file, a pipe, nohup, CI): a plain line when
    morph/progress.py's Cadence says one is due, and the final one at `finish`. Subclasses say what the line holds
    (`text`)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.cadence = Cadence(every=0.1, gap=0.1) if self.tty else Cadence()
        self.started = False

    def show(self) -> None:
        self.started = True
        if self.cadence.due():
            self._write(self.text(final=False))

    def finish(self) -> None:
        """The final counts, once there was anything to count."""
        if self.started:
            self._write(self.text(final=True))
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()

    def _write(self, line: str) -> None:
        self.stream.write("\r" + line if self.tty else line.rstrip() + "\n")
        self.stream.flush()

    def text(self, final: bool) -> str:
        raise NotImplementedError


class Progress(ProgressLine):
    """The engine's on_step(step, total) for one text: frames done of at most `total`, the number of segments,
    speed, and how long it can still take (EOS usually ends a segment sooner)."""

    def __init__(self, segments: int, stream=None):
        super().__init__(stream)
        self.segments, self.step, self.total = segments, 0, 0
        self.start = time.perf_counter()

    def __call__(self, step: int, total: int) -> None:
        self.step, self.total = step, total
        self.show()

    def text(self, final: bool) -> str:
        elapsed = time.perf_counter() - self.start
        rate = self.step / elapsed if elapsed > 0 and self.step > 1 else 0.0
        left = f"took {clock(elapsed)}" if final else \
            f"at most {clock((self.total - self.step) / rate)} left" if rate else "estimating"
        segments = f"{self.segments} segment{'s' if self.segments != 1 else ''}"
        return (f"{bar(self.step / max(self.total, 1))} frame {self.step} of at most {self.total} | {segments} | "
                f"{rate:.1f} frames/s | {left}  ")


def bar(fraction: float, width: int = 24) -> str:
    done = int(width * min(max(fraction, 0.0), 1.0))
    return f"[{'#' * done}{'.' * (width - done)}]"


def load_model(args: argparse.Namespace, mode: str = "auto"):
    """The MorphTTS that --model and its options name, loaded quietly, decoding in `mode`."""
    from morph.api import MorphTTS

    print(f"loading {args.model} ...", file=sys.stderr)
    return MorphTTS.load(args.model, args.device, args.dtype, args.attention, search_dirs=[args.models_dir],
                         download_dir=args.models_dir, mode=mode)


def guarded(job, args: argparse.Namespace) -> int:
    """Run a command with the CLI's logging; a bad input or a failure is one `error:` line (exit status 2), Ctrl-C
    one `interrupted` line (130)."""
    # Our own notes (downloads, the attention kernel) and every library's warnings; not their INFO chatter.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    logging.getLogger("morph").setLevel(logging.INFO)
    previous = interrupt_on_terminate()
    try:
        return job(args)
    except (CliError, ValueError, FileNotFoundError, RuntimeError, ImportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: speaking writes --out last, in one go; a script keeps its finished lines
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def interrupt_on_terminate():
    """`kill PID` ends a command as Ctrl-C does (finished lines kept, a Ray cluster it started stopped), not
    abruptly. Returns the handler it replaced (None off the main thread, where none can be set); `guarded` puts
    that back after the command."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
