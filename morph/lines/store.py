"""The line store of a rendered script: one WAV per finished line, the subtitles, and the manifest that lets a
rerun after a crash or cancel render only the lines that are missing or changed.

Shared by every front end that renders a script to a folder (the Render Lines node, `cli.py render`, and the
workers of a distributed job, which write their lines' files while one process keeps the manifest): it knows
files, names and fingerprints, nothing of ComfyUI or the engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from ..settings import SAMPLE_RATE

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = "_lines.json"  # next to the line files: what each file was rendered from
MANIFEST_VERSION = 1
_UNSAFE = re.compile(r"[^\w\-]+")


# -- what a line was rendered from ---------------------------------------------------------------------
def voice_digest(voice) -> str:
    h = hashlib.sha256(voice.spk_embedding.detach().float().cpu().contiguous().numpy().tobytes())
    if voice.ref_code is not None:
        h.update(voice.ref_code.detach().long().cpu().contiguous().numpy().tobytes())
    h.update(json.dumps(voice.ref_text).encode())
    return h.hexdigest()


def fingerprint(context: dict, name: str, text: str, voice=None, speaker: str | None = None, instruct: str = "") -> str:
    """One line's fingerprint: the render context (model and settings, chosen by the front end), the
    character's name, the text, and who speaks it: a cloned voice, or a CustomVoice speaker and an instruct, or a
    VoiceDesign instruct (a voice line's fingerprint holds only the voice, as it always has)."""
    line = dict(context, name=name, text=text)
    if voice is not None:
        line["voice"] = voice_digest(voice)
    else:
        line.update(speaker=speaker, instruct=instruct)
    return hashlib.sha256(json.dumps(line, sort_keys=True).encode()).hexdigest()


def file_name_part(name: str) -> str:
    """A character name as it appears in a file name: letters, digits, '-' and '_' only."""
    return _UNSAFE.sub("_", name).strip("_") or "line"


# -- the joined dialogue and its subtitles -----------------------------------------------------------------
def cues(lengths: list[int], pause_seconds: float) -> list[tuple[float, float]]:
    """Each clip's (start, end) in seconds once clips of these lengths (samples) are joined with pauses."""
    pause, at, found = int(round(pause_seconds * SAMPLE_RATE)), 0, []
    for i, n in enumerate(lengths):
        at += pause if i else 0
        found.append((at / SAMPLE_RATE, (at + n) / SAMPLE_RATE))
        at += n
    return found


def join_clips(clips: list[np.ndarray], pause_seconds: float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The clips joined with pauses, and each clip's (start, end) in seconds in the joined clip."""
    pause = np.zeros(int(round(pause_seconds * SAMPLE_RATE)), np.float32)
    pieces = []
    for i, clip in enumerate(clips):
        if i:
            pieces.append(pause)
        pieces.append(clip.astype(np.float32, copy=False))
    joined = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return joined, cues([clip.size for clip in clips], pause_seconds)


def _timestamp(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def srt(cues: list[tuple[float, float, str, str]]) -> str:
    """SRT subtitles: one cue per (start, end, name, text), as 'Name: text'."""
    blocks = [f"{n}\n{_timestamp(start)} --> {_timestamp(end)}\n{name}: {text}\n"
              for n, (start, end, name, text) in enumerate(cues, start=1)]
    return "\n".join(blocks)


# -- the files ---------------------------------------------------------------------------------------------
class LineFiles:
    """Where one render's files go under `root` (the node's: ComfyUI's output folder): `{prefix}_{index:04d}_{name}.wav`
    per line (float32 WAV, so a reused line is the exact audio), `{prefix}.wav` and `{prefix}.srt`, every file written
    atomically (temporary file, then rename). A worker of a distributed job writes its lines through this, without
    the manifest, which one process keeps (LineStore)."""

    def __init__(self, root: Path, prefix: str, who: str):
        prefix = str(prefix).strip().replace("\\", "/")
        parts = [p for p in prefix.split("/") if p not in ("", ".")]
        if not parts or prefix.startswith("/") or ".." in parts or re.match(r"^[A-Za-z]:", prefix):
            raise ValueError(f"filename_prefix {prefix!r} must be a relative name inside the output folder, "
                             "e.g. qwen3-tts/scene1")
        self.root, self.prefix = Path(root), prefix
        self.folder = Path(root).joinpath(*parts[:-1])
        self.stem = parts[-1]
        self.who = who

    def path(self, index: int, name: str) -> Path:
        return self.folder / f"{self.stem}_{index:04d}_{file_name_part(name)}.wav"

    @property
    def dialogue_path(self) -> Path:
        return self.folder / f"{self.stem}.wav"

    def write_line(self, index: int, name: str, wav: np.ndarray) -> Path:
        import soundfile

        path = self.path(index, name)
        self._write(path, lambda tmp: soundfile.write(str(tmp), wav, SAMPLE_RATE, subtype="FLOAT", format="WAV"))
        return path

    def join_lines(self, names: list[str], pause_seconds: float) -> Path:
        """`{prefix}.wav`: the line files of lines 1..len(names) joined with pauses, one file at a time (a long
        script's dialogue need not fit in memory)."""
        import soundfile

        pause = np.zeros(int(round(pause_seconds * SAMPLE_RATE)), np.float32)

        def join(tmp: Path) -> None:
            with soundfile.SoundFile(str(tmp), "w", SAMPLE_RATE, 1, subtype="FLOAT", format="WAV") as out:
                for i, name in enumerate(names):
                    if i:
                        out.write(pause)
                    out.write(soundfile.read(str(self.path(i + 1, name)), dtype="float32")[0])

        self._write(self.dialogue_path, join)
        return self.dialogue_path

    def _write(self, path: Path, write) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".part")
            write(tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise OSError(f"{self.who}: could not write {path} ({e}); check the output folder's permissions and "
                          "free space, or change filename_prefix") from e


class LineStore(LineFiles):
    """The line files and the manifest `{prefix}_lines.json` of what each line was rendered from, in script order;
    a line's file and the manifest are written before the next batch starts."""

    def __init__(self, root: Path, prefix: str, who: str):
        super().__init__(root, prefix, who)
        self.manifest_path = self.folder / f"{self.stem}{MANIFEST_SUFFIX}"
        self.lines: dict[int, dict] = {}  # this run's lines: reused or rendered
        self.changed = 0  # lines whose file an earlier run left from another text, voice, model or settings
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            assert manifest.get("version") == MANIFEST_VERSION and isinstance(manifest.get("lines"), dict)
            self.earlier = {int(k): v for k, v in manifest["lines"].items()}
        except FileNotFoundError:
            self.earlier = {}
        except (OSError, ValueError, AssertionError, AttributeError):
            log.warning("%s: %s is unreadable; rendering every line again", who, self.manifest_path)
            self.earlier = {}

    def load(self, index: int, name: str, fingerprint: str) -> np.ndarray | None:
        """The line's audio from an earlier run, or None when it must be rendered (again)."""
        import soundfile

        path = self.path(index, name)
        entry = self.earlier.get(index)
        if not path.is_file():
            return None
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint or entry.get("file") != path.name:
            log.debug("%s: %s was rendered from a different line or settings; rendering it again", self.who, path.name)
            self.changed += 1
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

    def record(self, written: list[tuple[int, str, str, str]]) -> None:
        """Line files already written, as (index, name, text, fingerprint): into the manifest, written once."""
        for index, name, text, fingerprint in written:
            self.lines[index] = dict(file=self.path(index, name).name, name=name, text=text, fingerprint=fingerprint)
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
