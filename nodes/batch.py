"""Qwen3-TTS Voice Bank and Render Lines: a dialogue script rendered in batches, in each character's voice,
with every finished line written to disk at once (one WAV per line, plus the SRT), so a crashed or cancelled
run resumes where it stopped."""

from __future__ import annotations

import logging

from ..morph.lines.script import check_name, name_key, parse_script
from ..morph.lines.store import LineStore
from ..morph.lines.words import FOR_NODES
from ..morph.memory import working_memory
from ..morph.progress import Cadence, JobProgress
from ..morph.render import Line, retired_batching
from ..morph.script_job import ScriptJob, job_context
from ..morph.settings import DEFAULT_BATCH_SIZE, RETIRED_BATCHING, SAMPLE_RATE
from ..postprocess import smooth
from . import services
from .common import CATEGORY, VOICE_TYPE, generation_inputs, model_input, prefixed, split_generation_options, \
    text_input, to_audio

log = logging.getLogger(__name__)

BANK_TYPE = "QWEN3TTS_VOICE_BANK"  # {name_key(name): (display name, Voice)}
MAX_BATCH_SIZE = 64
RERUN = "queue it again with resume on"  # how a user renders the rest after a stop
EXAMPLE_SCRIPT = ("# One spoken line per line, as  Name: text\n"
                  "Alice: Did you hear that? Something moved in the garden.\n"
                  "Bob: It's only the wind. Go back to sleep.")


class VoiceBank:
    NODE_ID = "Qwen3TTSMorphVoiceBank"
    DISPLAY_NAME = "Qwen3-TTS Voice Bank"
    DESCRIPTION = (
        "Names a voice for Render Lines: adds the character name + voice to a voice bank. Chain one Voice Bank "
        "per character (bank in -> bank out); names are matched case-insensitively in the script and must be "
        "unique in the chain.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (BANK_TYPE,)
    RETURN_NAMES = ("bank",)
    OUTPUT_TOOLTIPS = ("The bank with this character added: connect it to the next Voice Bank or to Render Lines.",)
    FUNCTION = "add"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "name": ("STRING", {"default": "Alice", "tooltip":
                         "The character's name as the script writes it before the colon (Alice: ...). "
                         "Case and extra spaces do not matter; no ':' and no leading '#'."}),
                "voice": (VOICE_TYPE, {"tooltip": "The character's voice (from Voice Prompt or Load Voice)."}),
            },
            "optional": {
                "bank": (BANK_TYPE, {"tooltip": "Optional: the bank of the previous Voice Bank node, to chain "
                                                "characters. Left empty, this node starts a new bank."}),
            },
        }

    def add(self, name, voice, bank=None):
        who = self.DISPLAY_NAME
        display = check_name(name, who)
        if not hasattr(voice, "spk_embedding"):
            raise ValueError(f"{who}: voice is not a Qwen3-TTS voice; connect Voice Prompt or Load Voice")
        if bank is not None and not isinstance(bank, dict):
            raise ValueError(f"{who}: bank is not a voice bank; connect the bank output of another Voice Bank")
        key = name_key(display)
        if bank and key in bank:
            raise ValueError(f"{who}: {display!r} is already in the bank (as {bank[key][0]!r}); give each "
                             "character its own name")
        return ({**(bank or {}), key: (display, voice)},)


class RenderLines:
    NODE_ID = "Qwen3TTSMorphRenderLines"
    DISPLAY_NAME = "Qwen3-TTS Render Lines"
    DESCRIPTION = (
        "Renders a dialogue script (one 'Name: text' line per spoken line; blank lines and # comments skipped) in "
        "each character's voice from the Voice Bank, batch_size lines at a time on the GPU: far faster than one "
        "line at a time. Writes every line to the output folder as <prefix>_<index>_<name>.wav as soon as its "
        "batch finishes, the subtitles as <prefix>.srt, and a manifest <prefix>_lines.json of what each line was "
        "rendered from. Outputs every line as its own audio, the whole dialogue joined with pauses, and the SRT "
        "text. With resume on, a rerun after a crash or Cancel renders only the missing or changed lines. "
        "Progress counts frames across the batch; Cancel stops within one step.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("AUDIO", "AUDIO", "STRING")
    RETURN_NAMES = ("lines", "dialogue", "srt")
    OUTPUT_IS_LIST = (True, False, False)
    OUTPUT_NODE = True  # it writes the line files and the SRT itself
    OUTPUT_TOOLTIPS = (
        "One mono 24 kHz clip per script line, in script order (a list; the node has already written each to "
        "the output folder, so it needs no Save Audio).",
        "The whole dialogue as one clip, the lines joined with pause_seconds of silence.",
        "SRT subtitles of the dialogue clip: one cue per line, 'Name: text', with its start and end time.",
    )
    FUNCTION = "render"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": model_input("Must be a Base model of the size the voices were made with."),
            "bank": (BANK_TYPE, {"tooltip": "The characters and their voices: the last Voice Bank of the chain."}),
            "script": text_input("One spoken line per line, written 'Name: text' (names as in the voice bank, any "
                                 "case). Blank lines and lines starting with # are skipped.", EXAMPLE_SCRIPT),
            "batch_size": ("INT", {"default": DEFAULT_BATCH_SIZE, "min": 1, "max": MAX_BATCH_SIZE, "step": 1,
                           "tooltip": "Lines rendered at once. More is faster overall but needs more VRAM; on "
                                      "out-of-memory the batch is halved automatically (and the log says which "
                                      "size worked). 64 fits the 0.6B model on an 8 GB card and the 1.7B on "
                                      "12 GB (32 for the 1.7B on 8 GB). A line that ends gives its place to the next "
                                      "at once, and each line draws from its own random stream, so a seeded line's "
                                      "take does not depend on its batch (up to rounding). In eager speed mode (the "
                                      "exact reference) lines render in static batches, and a sampled line's take "
                                      "depends on its batch."}),
            # retired: kept for one release so that saved workflows, whose widget values are positional, still load
            "batching": (list(RETIRED_BATCHING), {"default": RETIRED_BATCHING[0], "tooltip":
                         "Retired; goes in the next release. Every speed mode but eager renders in the continuous "
                         "batch, and eager (the exact reference) in static batches, whatever this says."}),
            "pause_seconds": ("FLOAT", {"default": 0.4, "min": 0.0, "max": 10.0, "step": 0.05, "tooltip":
                              "Silence between lines in the joined dialogue (and so in the SRT timing)."}),
            "smoothing": ("BOOLEAN", {"default": True, "tooltip":
                          "Smooth each line (Butterworth low-pass at 11 kHz) and normalise its peak to -3 dBFS, "
                          "as Qwen3-TTS Smooth & Normalize does with its defaults."}),
            "resume": ("BOOLEAN", {"default": True, "tooltip":
                       "Reuse the line files an earlier run left in the output folder instead of rendering them "
                       "again. A line is rendered again when its text, character, voice, language, model, dtype, "
                       "attention, speed mode, smoothing or generation settings changed; the seed and batch size "
                       "do not count, so a randomized seed still resumes. Off: every line is rendered and its file "
                       "overwritten."}),
            "filename_prefix": ("STRING", {"default": "qwen3-tts/dialogue", "tooltip":
                                "Where the line files, the .srt and the manifest go, inside ComfyUI's output "
                                "folder; may hold subfolders (qwen3-tts/scene1 -> output/qwen3-tts/scene1_0001_"
                                "Alice.wav, output/qwen3-tts/scene1.srt)."}),
            **generation_inputs(),
        }}

    def render(self, model, bank, script, batch_size, batching, pause_seconds, smoothing, resume, filename_prefix,
               **options):
        who = self.DISPLAY_NAME
        # the checks too: what they warn of (a retired batching) is shown on the node, not only in the log
        with services.messages_on_node():
            try:
                language, settings = split_generation_options(options)
                settings.validate(who)
                retired_batching(batching, who)
                if not isinstance(bank, dict) or not bank:
                    raise ValueError("bank is empty or not a voice bank; connect a Qwen3-TTS Voice Bank")
                if not isinstance(pause_seconds, (int, float)) or not 0 <= pause_seconds <= 600:
                    raise ValueError(f"pause_seconds must be between 0 and 600, got {pause_seconds!r}")
                parsed = parse_script(script, [display for display, _ in bank.values()], FOR_NODES)
                store = LineStore(services.output_dir(), filename_prefix, who, words=FOR_NODES)
            except ValueError as e:
                raise prefixed(e, who) from e
            services.check_interrupt()
            lines = [Line(p.text, bank[name_key(p.name)][1], language) for p in parsed]
            context = job_context(model.tts.config, language, settings, smoothing)

            def prepare(rendering: list[Line]):
                return model.ready(working_memory(model.tts, [(line.text, line.voice) for line in rendering],
                                                  settings, int(batch_size), device=model.load_device),
                                   int(batch_size), who)

            with store:  # one job at a time writes filename_prefix
                job = ScriptJob(parsed, lines, store, context, rerun=RERUN)
                if resume:
                    job.reuse()
                progress = LinesProgress(len(job.todo()), who)
                try:
                    result = job.run(prepare, settings, int(batch_size), float(pause_seconds),
                                     finish_line=(lambda wav: smooth(wav, SAMPLE_RATE)) if smoothing else None,
                                     on_step=progress.step, on_line=progress.line, who=who, words=FOR_NODES)
                except BaseException:  # Cancel or an interrupt (a BaseException in ComfyUI 0.33), or a failure
                    # the lines on disk replace the last progress report, which can lag the line writer
                    progress.stopped(len(store.lines), len(lines))
                    raise
                progress.finish()
        return ([to_audio(c, SAMPLE_RATE) for c in result.clips], to_audio(result.dialogue, SAMPLE_RATE),
                result.subtitles)


class LinesProgress:
    """Render Lines' progress: ComfyUI's bar and Cancel follow the frames (services.StepReporter); the lines done,
    audio, speed and time left (morph/progress.py, what cli.py render prints) go to the log and the node as a
    progress line, at each batch of lines done and every few seconds between."""

    def __init__(self, lines: int, who: str):
        self.bar, self.tally, self.cadence, self.who = services.step_callback(), JobProgress(lines), Cadence(), who

    def step(self, done: int, total: int) -> None:
        self.bar(done, total)
        self.tally.step(done, total)
        if self.cadence.due():
            self._report(final=False)

    def line(self, index: int, wav) -> None:
        self.tally.lines_done([wav.size])
        self.cadence.mark()

    def finish(self) -> None:
        if self.tally.lines:
            self._report(final=True)

    def stopped(self, kept: int, lines: int) -> None:
        """In place of the progress line, once the render stopped: `kept` is what the line store recorded for this
        job (every line written is recorded before the render's error leaves it), so it is what the folder holds,
        where the tally of lines done may lag behind the writer."""
        log.info("%s: stopped: %d of %d lines kept; %s to render the rest", self.who, kept, lines, RERUN,
                 extra={"progress": True})

    def _report(self, final: bool) -> None:
        log.info("%s: %s", self.who, self.tally.summary(final), extra={"progress": True})


__all__ = ["BANK_TYPE", "RenderLines", "VoiceBank"]
