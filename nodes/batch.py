"""Qwen3-TTS Voice Bank and Render Lines: a dialogue script rendered in batches, in each character's voice,
with every finished line written to disk at once (one WAV per line, plus the SRT), so a crashed or cancelled
run resumes where it stopped."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import torch

from ..morph.batch import DEFAULT_BATCH_SIZE, BatchTTS, Line
from ..morph.memory import working_memory
from ..morph.script import check_name, name_key, parse_script
from ..morph.settings import SAMPLE_RATE
from ..postprocess import lowpass, peak_normalize
from . import services
from .common import CATEGORY, VOICE_TYPE, generation_inputs, model_input, prefixed, split_generation_options, \
    text_input, to_audio

log = logging.getLogger(__name__)

BANK_TYPE = "QWEN3TTS_VOICE_BANK"  # {name_key(name): (display name, Voice)}
MAX_BATCH_SIZE = 64
MANIFEST_SUFFIX = "_lines.json"  # next to the line files: what each file was rendered from
MANIFEST_VERSION = 1
_UNSAFE = re.compile(r"[^\w\-]+")
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
                                      "size worked). With sampling on, a line's take depends on its batch."}),
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

    def render(self, model, bank, script, batch_size, pause_seconds, smoothing, resume, filename_prefix, **options):
        who = self.DISPLAY_NAME
        try:
            language, settings = split_generation_options(options)
            settings.validate(who)
            if not isinstance(bank, dict) or not bank:
                raise ValueError("bank is empty or not a voice bank; connect a Qwen3-TTS Voice Bank")
            if not isinstance(pause_seconds, (int, float)) or not 0 <= pause_seconds <= 600:
                raise ValueError(f"pause_seconds must be between 0 and 600, got {pause_seconds!r}")
            parsed = parse_script(script, [display for display, _ in bank.values()])
            store = _LineStore(filename_prefix, who)
        except ValueError as e:
            raise prefixed(e, who) from e
        services.check_interrupt()
        lines = [Line(p.text, bank[name_key(p.name)][1], language) for p in parsed]
        labels = [f"script line {p.number}, {p.name}" for p in parsed]

        context = _render_context(model, language, settings, smoothing)
        fingerprints = [_fingerprint(context, p.name, line) for p, line in zip(parsed, lines)]
        audio: dict[int, np.ndarray] = {}
        if resume:
            for i, p in enumerate(parsed):
                kept = store.load(i + 1, p.name, fingerprints[i])
                if kept is not None:
                    audio[i] = kept
            if audio:
                log.info("%s: %d of %d lines already rendered in %s; rendering the other %d", who, len(audio),
                         len(lines), store.folder, len(lines) - len(audio))
        todo = [i for i in range(len(lines)) if i not in audio]

        def finished(k: int, wav: np.ndarray) -> None:
            i = todo[k]
            wav = _smooth(wav) if smoothing else wav
            store.save(i + 1, parsed[i].name, parsed[i].text, fingerprints[i], wav)
            audio[i] = wav

        with services.messages_on_node():
            if todo:
                rendering = [lines[i] for i in todo]
                tts = model.ready(working_memory(model.tts, [(line.text, line.voice) for line in rendering], settings,
                                                 int(batch_size)))
                reporter = services.step_callback()
                BatchTTS(tts).render(rendering, settings, batch_size=int(batch_size), on_step=reporter,
                                     on_line=finished, who=who, labels=[labels[i] for i in todo])
                reporter.finish()
            clips = [audio[i] for i in range(len(lines))]
            dialogue, cues = _join(clips, float(pause_seconds))
            srt = _srt([(start, end, p.name, p.text) for (start, end), p in zip(cues, parsed)])
            store.finish(len(lines), srt)
        return ([to_audio(c, SAMPLE_RATE) for c in clips], to_audio(dialogue, SAMPLE_RATE), srt)


# -- audio, timing, subtitles -----------------------------------------------------------------------
def _smooth(wav: np.ndarray) -> np.ndarray:
    if wav.size == 0:
        return wav
    return np.ascontiguousarray(peak_normalize(lowpass(wav, SAMPLE_RATE)), dtype=np.float32)


def _join(clips: list[np.ndarray], pause_seconds: float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The clips joined with pauses, and each clip's (start, end) in seconds in the joined clip."""
    pause = np.zeros(int(round(pause_seconds * SAMPLE_RATE)), np.float32)
    pieces, cues, at = [], [], 0
    for i, clip in enumerate(clips):
        if i:
            pieces.append(pause)
            at += pause.size
        cues.append((at / SAMPLE_RATE, (at + clip.size) / SAMPLE_RATE))
        pieces.append(clip.astype(np.float32, copy=False))
        at += clip.size
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), cues


def _timestamp(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def _srt(cues: list[tuple[float, float, str, str]]) -> str:
    blocks = [f"{n}\n{_timestamp(start)} --> {_timestamp(end)}\n{name}: {text}\n"
              for n, (start, end, name, text) in enumerate(cues, start=1)]
    return "\n".join(blocks)


# -- resume: the line files and what they were rendered from ---------------------------------------------
def _render_context(model, language: str, settings, smoothing: bool) -> dict:
    """What, besides the line itself, decides a line's audio: the model as loaded (checkpoint, dtype, attention
    kernel, decode mode and the kind of device it runs on) and every generation setting but the seed (so a
    randomized seed still resumes; the batch size is left out too)."""
    tts = model.tts
    return dict(model=str(tts.source), model_size=tts.model_size, dtype=str(tts.tts.model.dtype),
                attention=str(tts.tts.model.config._attn_implementation), mode=str(tts.patch.mode),
                device=torch.device(model.load_device).type, language=language, smoothing=bool(smoothing),
                settings={k: v for k, v in dataclasses.asdict(settings).items() if k != "seed"})


def _voice_digest(voice) -> str:
    h = hashlib.sha256(voice.spk_embedding.detach().float().cpu().contiguous().numpy().tobytes())
    if voice.ref_code is not None:
        h.update(voice.ref_code.detach().long().cpu().contiguous().numpy().tobytes())
    h.update(json.dumps(voice.ref_text).encode())
    return h.hexdigest()


def _fingerprint(context: dict, name: str, line: Line) -> str:
    blob = json.dumps(dict(context, name=name, text=line.text, voice=_voice_digest(line.voice)), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_name_part(name: str) -> str:
    """A character name as it appears in a file name: letters, digits, '-' and '_' only."""
    return _UNSAFE.sub("_", name).strip("_") or "line"


class _LineStore:
    """The files of one render in ComfyUI's output folder: `{prefix}_{index:04d}_{name}.wav` per line (float32
    WAV, so a reused line is the exact audio), the subtitles `{prefix}.srt`, and a manifest `{prefix}_lines.json`
    of what each line was rendered from, in script order. Every file is written atomically (temporary file,
    then rename); a line's file and the manifest are written before the next batch starts."""

    def __init__(self, prefix: str, who: str):
        prefix = str(prefix).strip().replace("\\", "/")
        parts = [p for p in prefix.split("/") if p not in ("", ".")]
        if not parts or prefix.startswith("/") or ".." in parts or re.match(r"^[A-Za-z]:", prefix):
            raise ValueError(f"filename_prefix {prefix!r} must be a relative name inside the output folder, "
                             "e.g. qwen3-tts/scene1")
        root = services.output_dir()
        self.folder = root.joinpath(*parts[:-1])
        self.stem = parts[-1]
        self.manifest_path = self.folder / f"{self.stem}{MANIFEST_SUFFIX}"
        self.who = who
        self.lines: dict[int, dict] = {}  # this run's lines: reused or rendered
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            assert manifest.get("version") == MANIFEST_VERSION and isinstance(manifest.get("lines"), dict)
            self.earlier = {int(k): v for k, v in manifest["lines"].items()}
        except FileNotFoundError:
            self.earlier = {}
        except (OSError, ValueError, AssertionError, AttributeError):
            log.warning("%s: %s is unreadable; rendering every line again", who, self.manifest_path)
            self.earlier = {}

    def path(self, index: int, name: str) -> Path:
        return self.folder / f"{self.stem}_{index:04d}_{file_name_part(name)}.wav"

    def load(self, index: int, name: str, fingerprint: str) -> np.ndarray | None:
        """The line's audio from an earlier run, or None when it must be rendered (again)."""
        import soundfile

        path = self.path(index, name)
        entry = self.earlier.get(index)
        if not path.is_file():
            return None
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint or entry.get("file") != path.name:
            log.info("%s: %s was rendered from a different line or settings; rendering it again", self.who, path.name)
            return None
        try:
            wav, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
        except Exception as e:  # soundfile raises its own error types for damaged files
            log.warning("%s: cannot read %s (%s); rendering it again", self.who, path.name, e)
            return None
        if rate != SAMPLE_RATE or wav.ndim != 1:
            log.warning("%s: %s is not mono %d Hz; rendering it again", self.who, path.name, SAMPLE_RATE)
            return None
        self.lines[index] = entry
        return np.ascontiguousarray(wav, dtype=np.float32)

    def save(self, index: int, name: str, text: str, fingerprint: str, wav: np.ndarray) -> None:
        import soundfile

        path = self.path(index, name)
        self._write(path, lambda tmp: soundfile.write(str(tmp), wav, SAMPLE_RATE, subtype="FLOAT", format="WAV"))
        self.lines[index] = dict(file=path.name, name=name, text=text, fingerprint=fingerprint)
        self._write_manifest()

    def finish(self, count: int, srt: str) -> None:
        """The subtitles, and the manifest of exactly this script's lines."""
        self.lines = {i: e for i, e in self.lines.items() if i <= count}
        self._write(self.folder / f"{self.stem}.srt", lambda tmp: tmp.write_text(srt, encoding="utf-8"))
        self._write_manifest()

    def _write_manifest(self) -> None:
        # Lines finish longest first; the manifest lists them in script order, whatever order they came in.
        manifest = {"version": MANIFEST_VERSION, "lines": {f"{i:04d}": self.lines[i] for i in sorted(self.lines)}}
        text = json.dumps(manifest, indent=1, ensure_ascii=False)
        self._write(self.manifest_path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def _write(self, path: Path, write) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".part")
            write(tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise OSError(f"{self.who}: could not write {path} ({e}); check the output folder's permissions and "
                          "free space, or change filename_prefix") from e


__all__ = ["BANK_TYPE", "RenderLines", "VoiceBank", "file_name_part"]
