"""`cli.py render`: a dialogue script rendered into a folder, as ComfyUI's Render Lines node reads and writes it;
everything is checked before the model loads (the script against the characters, every voice file, the folder).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

from cli_common import (OUTPUT_DIR, CliError, Parser, ProgressLine, add_generation_options, add_model_options, bar,
                        check_language, check_model, check_voice_file, check_writable, guarded, interrupt_on_terminate,
                        is_saved_voice, load_model, read_clip, settings_from)
from morph.lines.words import FOR_CLI
from morph.progress import JobProgress
from morph.settings import DEFAULT_BATCH_SIZE, RETIRED_BATCHING, SAMPLE_RATE

MAX_PAUSE_SECONDS = 600
KINDS = {"voice": "base", "speaker": "custom_voice", "design": "voice_design"}


DESCRIPTION = """\
Render a script into a folder: a WAV per line, the joined dialogue, SRT subtitles and a manifest.
The script is one 'Name: text' line per spoken line ('#' starts a comment); a rerun of the same
command renders only the lines that are missing or changed."""
EXAMPLES = """\
examples:
  python cli.py render scene1.txt --voice Alice=alice.wav --transcript "Alice=What alice.wav says." \\
      --voice Bob=bob.safetensors --prefix scene1
  python cli.py render scene1.txt --speaker Alice=Vivian --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice
  python cli.py render scene1.txt --design "Alice=A warm, low voice" --model Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign
"""


def build_parser() -> Parser:
    p = Parser(prog="cli.py render", usage="python cli.py render SCRIPT --voice NAME=FILE ... [options]",
               description=DESCRIPTION, epilog=EXAMPLES)
    p.add_argument("script", type=Path, help="the script, a UTF-8 text file")
    p.add_argument("--voice", action="append", default=[], metavar="NAME=FILE",
                   help="a character cloned from a clip or a saved voice (.safetensors); Base models")
    p.add_argument("--transcript", action="append", default=[], metavar="NAME=TEXT",
                   help="what a --voice clip says; without it, x-vector only")
    p.add_argument("--speaker", action="append", default=[], metavar="NAME=SPEAKER",
                   help="a built-in speaker; CustomVoice models")
    p.add_argument("--design", action="append", default=[], metavar="NAME=DESCRIPTION",
                   help="a voice described in words; VoiceDesign models")
    p.add_argument("--out", type=Path, default=OUTPUT_DIR / "renders", help="the folder the files go into")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="lines rendered at once; more is faster and needs more VRAM")
    more = p.more()
    more.add_argument("--instruct", action="append", default=[], metavar="NAME=TEXT",
                      help="how a --speaker character speaks (1.7B CustomVoice models)")
    more.add_argument("--prefix", default="dialogue",
                      help="file names: PREFIX_0001_Name.wav per line, PREFIX.wav, PREFIX.srt, PREFIX_lines.json")
    # retired: still taken for one release, so that scripts that pass it run (morph/render.py retired_batching)
    more.add_argument("--batching", choices=RETIRED_BATCHING, default=None, help=argparse.SUPPRESS)
    more.add_argument("--pause", type=float, default=0.4, help="seconds of silence between lines in PREFIX.wav")
    more.add_argument("--no-resume", action="store_true", help="render every line again, even those already in --out")
    more.add_argument("--gpus", type=int, default=None, metavar="N",
                      help="render over N GPUs with Ray, one worker each (a local cluster, or the one --address "
                           "names); with --device cpu, N CPU workers")
    more.add_argument("--address", default=None, metavar="HEAD:PORT",
                      help="join a running Ray cluster (ray start --head on one machine, ray start --address on the "
                           "others; 'auto' for the one this machine joined) and render over its GPUs; --out must be "
                           "a folder every machine can write")
    add_model_options(p)
    # why a take can change with the batch: the README's "Render a script" and docs/scripts.md, Batching and memory
    add_generation_options(p, seed_help="random seed: the same seed, script and --batch-size give the same take on "
                                        "one machine; another batch size can change it in bf16 (GPUs) and eager "
                                        "mode (the CPU)")
    return p


def pairs(values: list[str], flag: str) -> dict[str, tuple[str, str]]:
    """{name key: (name as given, value)} of NAME=VALUE options, refusing a malformed or repeated one."""
    from morph.lines.script import check_name, name_key

    found: dict[str, tuple[str, str]] = {}
    for raw in values:
        name, eq, value = raw.partition("=")
        if not eq or not value.strip():
            raise CliError(f"{flag} {raw!r}: write it as {flag} NAME=VALUE, e.g. {flag} Alice=...")
        shown = check_name(name, flag)
        if name_key(shown) in found:
            raise CliError(f"{flag}: {name.strip()!r} is given twice")
        found[name_key(shown)] = (shown, value.strip())
    return found


def characters(args) -> tuple[str, dict[str, tuple[str, str]]]:
    """The model variant the characters need, and {name key: (display name, what the option gave)}."""
    given = {kind: pairs(getattr(args, kind), f"--{kind}") for kind in KINDS}
    used = [kind for kind in KINDS if given[kind]]
    if not used:
        raise CliError("give each character of the script a voice: --voice NAME=FILE (Base models), "
                       "--speaker NAME=SPEAKER (CustomVoice) or --design NAME=DESCRIPTION (VoiceDesign)")
    if len(used) > 1:
        raise CliError(f"--{used[0]} and --{used[1]} need different models; one script renders on one model")
    for flag, extra, owner in (("--transcript", args.transcript, "voice"), ("--instruct", args.instruct, "speaker")):
        named = pairs(extra, flag)
        stray = [shown for key, (shown, _) in named.items() if key not in given[owner]]  # as the user typed them
        if stray:
            raise CliError(f"{flag}: {', '.join(stray)} {'has' if len(stray) == 1 else 'have'} no --{owner}")
    return KINDS[used[0]], given[used[0]]


class ScriptProgress(ProgressLine):
    """Lines done, seconds of audio, speed and time left (morph/progress.py's JobProgress, what Render Lines shows
    too): the time left follows the frame slots the scheduler reports (on_step), the lines and their audio come as
    each line is written (on_line, one process) or each batch (on_lines, workers). A log gets a line at each batch
    of lines done, and one every few seconds between."""

    def __init__(self, lines: int, stream=None):
        super().__init__(stream)
        self.tally = JobProgress(lines)

    def step(self, done: int, total: int) -> None:
        self.tally.step(done, total)
        self.show()

    def line(self, index: int, wav) -> None:
        """One line written: counted now, reported at the next frame, once the rest of its batch is in too."""
        self.tally.lines_done([wav.size])
        self.cadence.mark()

    def lines_done(self, rendered: list[tuple[int, int]]) -> None:
        """A batch of lines written, as (script index, samples)."""
        self.tally.lines_done(samples for _, samples in rendered)
        self.cadence.mark()
        self.show()

    def text(self, final: bool) -> str:
        return f"{bar(1.0 if final else self.tally.fraction)} {self.tally.summary(final)}  "


def run(args: argparse.Namespace) -> int:
    from morph.lines.script import parse_script

    variant, cast = characters(args)
    check_model(args)
    if not args.script.is_file():
        raise CliError(f"script: file not found: {args.script}")
    try:
        parsed = parse_script(args.script.read_text(encoding="utf-8"), [name for name, _ in cast.values()], FOR_CLI)
    except (UnicodeDecodeError, ValueError) as e:
        raise CliError(f"script {args.script}: {e}") from e
    language = check_language(args.language)
    settings = settings_from(args)
    if args.batch_size < 1:
        raise CliError(f"--batch-size must be 1 or more, got {args.batch_size}")
    if not 0 <= args.pause <= MAX_PAUSE_SECONDS:
        raise CliError(f"--pause must be from 0 to {MAX_PAUSE_SECONDS} seconds, got {args.pause:g}")
    if args.gpus is not None and args.gpus < 1:
        raise CliError(f"--gpus must be 1 or more (the number of GPUs to render over), got {args.gpus}")
    check_writable(args.out, "--out")  # made when the job takes it (LineStore), and removed if left empty
    from morph.lines.store import LineStore

    try:
        store = LineStore(args.out, args.prefix, "cli.py render", what=f"cli.py render {args.script}", words=FOR_CLI)
    except ValueError as e:
        raise CliError(str(e)) from e
    transcripts = {key: text for key, (_, text) in pairs(args.transcript, "--transcript").items()}
    clips = read_voices(cast, transcripts) if variant == "base" else {}  # every clip checked before the load
    with store, Renderer(args) as renderer:  # this command alone writes --prefix in --out until it ends
        kind = renderer.checkpoint.get("tts_model_type")
        if kind != variant:
            from morph.qwen.checkpoints import VARIANT_NAMES

            flag = next(f"--{k}" for k, v in KINDS.items() if v == variant)
            raise CliError(f"--model: {args.model} is a {VARIANT_NAMES.get(kind, kind)} model; {flag} needs a "
                           f"{VARIANT_NAMES.get(variant, variant)} model")
        instructs = {key: text for key, (_, text) in pairs(args.instruct, "--instruct").items()}
        lines = script_lines(renderer, variant, cast, clips, transcripts, instructs, parsed, language)
        return write(renderer, parsed, lines, store, language, settings, args)


class Renderer:
    """The model in this process, or a WorkerPool (--gpus, --address), started the first time a voice or a line needs
    it: a rerun with every line in --out starts no cluster and loads no model. The fingerprints' context is worked
    out from the checkpoint's config and the load options, as MorphTTS.load resolves them on this machine; workers on
    other machines (--address) may resolve auto otherwise, so there it is theirs."""

    def __init__(self, args):
        from morph.qwen.checkpoints import locate_checkpoint
        from morph.qwen.loading import checkpoint_config

        self.args, self.tts, self.distributed = args, None, args.gpus is not None or args.address is not None
        if self.distributed:
            from morph.distributed.job import import_ray

            import_ray("--gpus" if args.address is None else "--address")  # before a download
        self.folder = locate_checkpoint(args.model, [args.models_dir], args.models_dir)
        self.checkpoint = checkpoint_config(self.folder)  # its config.json: what the model is, before a load

    def __enter__(self) -> "Renderer":
        return self

    def __exit__(self, *exc) -> None:
        if self.distributed and self.tts is not None:
            self.tts.close()

    def __call__(self, todo=None):
        """The model or the pool (each worker with the model loaded), started on the first call."""
        if self.tts is None and not self.distributed:
            self.tts = load_model(self.args)
            self.tts.ready(self.args.batch_size, who="cli.py render")
        elif self.tts is None:
            from morph.distributed.job import WorkerPool
            import postprocess  # the workers smooth their lines

            args = self.args
            print(f"loading {args.model} ...", file=sys.stderr)
            load = dict(source=args.model, device=args.device, dtype=args.dtype, attention=args.attention,
                        search_dirs=[args.models_dir], download_dir=args.models_dir)
            self.tts = WorkerPool(args.gpus, load, args.address, who="cli.py render", packages=[postprocess])
            interrupt_on_terminate()  # ray.init put in its own SIGTERM handler, which exits at once
        return self.tts

    def context(self, language: str, settings, smoothing: bool) -> dict:
        from morph.config import ModelConfig
        from morph.script_job import job_context

        args = self.args
        if args.address is not None:
            return self().context(language, settings, smoothing)
        # as load_model's MorphTTS.load resolves it, in its default mode
        return job_context(ModelConfig.resolve(args.model, self.folder, args.device, args.dtype, args.attention),
                           language, settings, smoothing)


def read_voices(cast: dict, transcripts: dict) -> dict:
    """{name key: a saved Voice, or (a prepared clip, its file name)} for every --voice, checked whole; a clip with
    a --transcript as in-context cloning checks it (over 30 s it is refused, not trimmed under its transcript).
    The clips first: their checks need no torch, which a saved voice's file loads (seconds on a busy machine)."""
    import dataclasses

    voices, saved = {}, {}
    for key, (name, value) in cast.items():
        path, who = check_voice_file(Path(value)), f"--voice {name}={value}"
        if is_saved_voice(path):
            saved[key] = (path, who)
            continue
        words = dataclasses.replace(FOR_CLI, new_clip=f"give {name} another recording",
                                    no_transcript=f"leave out --transcript {name}=...")
        voices[key] = (read_clip(path, who, key in transcripts, words), path.name)
    if saved:
        from morph.lines.voice import load_voice

        voices.update((key, load_voice(path, who, FOR_CLI)) for key, (path, who) in saved.items())
    return voices


def script_lines(renderer, variant, cast, clips, transcripts, instructs, parsed, language) -> list:
    """One scheduler Line per script line, each character's voice made once (a clip's by the model: its voice, which
    the fingerprint holds, is known only once made)."""
    from morph.lines.script import name_key
    from morph.render import Line

    made = {}
    for key, (name, value) in cast.items():
        if variant == "base":
            saved = clips[key]
            made[key] = dict(voice=saved if not isinstance(saved, tuple) else renderer().voice_from_clip(
                saved[0], transcripts.get(key), who=f"--voice {name}={saved[1]}"))
        elif variant == "custom_voice":
            made[key] = dict(speaker=value, instruct=instructs.get(key, ""))
        else:
            made[key] = dict(instruct=value)
    return [Line(p.text, language=language, **made[name_key(p.name)]) for p in parsed]


def write(renderer, parsed, lines, store, language, settings, args) -> int:
    from morph.settings import runs_lean
    from morph.qwen.quiet import quiet_third_party
    from morph.render import retired_batching
    from morph.script_job import ScriptJob
    from postprocess import smooth

    pool = renderer.distributed  # a WorkerPool: its workers write the files
    smoothing = not args.no_smooth
    job = ScriptJob(parsed, lines, store, renderer.context(language, settings, smoothing),
                    rerun="run the same command again")
    kept = job.reuse(keep_audio=not pool) if not args.no_resume else 0
    progress = ScriptProgress(len(lines) - kept)
    finish_line = functools.partial(smooth, sample_rate=SAMPLE_RATE) if smoothing else None
    start = time.perf_counter()
    todo = job.todo()
    if args.batching is not None:
        retired_batching(args.batching, "--batching")
    if todo:  # the model loads only if a line is left to render
        where = f"{len(renderer().actors)} workers" if pool else str(renderer().device)
        if pool:  # each worker runs its batches as its own speed mode does
            how = "each worker's continuous batch (static batches in eager mode)"
        else:
            how = "a continuous batch" if runs_lean(renderer()) else "static batches"
        # the lines already in --out are said once, by job.reuse
        print(f"rendering {len(lines) - kept} of {len(lines)} lines on {where}, {args.batch_size} at a time in {how}",
              file=sys.stderr)
    try:
        with quiet_third_party():  # transformers' note on the repetition penalty, at the first generate
            if pool and todo:
                renderer().render(job, settings, args.batch_size, args.pause, finish_line, on_step=progress.step,
                                on_lines=progress.lines_done, words=FOR_CLI)
            elif pool:
                job.write_dialogue(args.pause)
                job.finish(args.pause)
            else:
                job.run(renderer, settings, args.batch_size, args.pause, finish_line=finish_line, on_step=progress.step,
                        on_line=progress.line, who="cli.py render", words=FOR_CLI, dialogue=True)
    except KeyboardInterrupt:
        progress.finish()
        print(f"interrupted: {len(job.lengths)} of {len(lines)} lines are in {store.folder}; the same command "
              "renders the rest", file=sys.stderr)
        return 130
    progress.finish()
    took = time.perf_counter() - start
    print(f"wrote {len(lines)} lines ({kept} reused), {progress.tally.audio_s:.1f} s of new audio in {took:.1f} s, "
          f"the dialogue {store.dialogue_path}, {store.stem}.srt and {store.manifest_path.name} in {store.folder}")
    return 0


def main(argv=None) -> int:
    return guarded(run, build_parser().parse_args(argv))
