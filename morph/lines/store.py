"""The line store of a rendered script: one WAV per finished line, the subtitles, and the manifest that lets a rerun
render only the lines missing or changed (docs/scripts.md, Resume). A distributed job's workers write their lines'
files (LineFiles) while one process keeps the manifest (LineStore)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..settings import SAMPLE_RATE
from .files import digest, wav_bytes, wav_header, write_atomic
from .job_lock import JobLock, check_holds
from .words import FOR_PYTHON, Words

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = "_lines.json"  # next to the line files: what each file was rendered from
MANIFEST_VERSION = 2  # 2: each entry holds its file's samples and sha256
_UNSAFE = re.compile(r"[^\w\-]+")


# -- what a line was rendered from ---------------------------------------------------------------------
def voice_digest(voice) -> str:
    h = hashlib.sha256(voice.spk_embedding.detach().float().cpu().contiguous().numpy().tobytes())
    if voice.ref_code is not None:
        h.update(voice.ref_code.detach().long().cpu().contiguous().numpy().tobytes())
    h.update(json.dumps(voice.ref_text).encode())
    return h.hexdigest()


def fingerprint(context: dict, name: str, text: str, voice=None, speaker: str | None = None, instruct: str = "") -> str:
    """One line's fingerprint: the render context, the character's name, the text, and who speaks it. A cloned
    voice's line holds no speaker or instruct key, so earlier manifests' voice lines stay valid."""
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
    return "\n".join(f"{n}\n{_timestamp(start)} --> {_timestamp(end)}\n{name}: {text}\n"
                     for n, (start, end, name, text) in enumerate(cues, start=1))


# -- the files ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Written:
    """A line file as written: what its manifest entry records, so a rerun can tell the file is still that one."""
    file: str  # its name in the store's folder
    samples: int
    sha256: str  # of the whole file


class LineFiles:
    """Where one render's files go under `root`: `{prefix}_{index:04d}_{name}.wav` per line (float32, so a reused line
    is the exact audio), `{prefix}.wav` and `{prefix}.srt`, each written whole or not at all. A distributed worker
    writes with the driver's lock `token` (JobLock.token): a file lands only while that job holds the folder."""

    def __init__(self, root: Path, prefix: str, who: str, words: Words = FOR_PYTHON, token: str | None = None):
        prefix = str(prefix).strip().replace("\\", "/")
        parts = [p for p in prefix.split("/") if p not in ("", ".")]
        if not parts or prefix.startswith("/") or ".." in parts or re.match(r"^[A-Za-z]:", prefix):
            raise ValueError(f"{words.prefix} {prefix!r} must be a relative name inside the output folder, "
                             "e.g. qwen3-tts/scene1")
        self.root, self.prefix = Path(root), prefix
        self.folder, self.stem = self.root.joinpath(*parts[:-1]), parts[-1]
        self.who, self.token = who, token
        self.lock_path = self.folder / f".{self.stem}.lock"

    def path(self, index: int, name: str) -> Path:
        return self.folder / f"{self.stem}_{index:04d}_{file_name_part(name)}.wav"

    @property
    def dialogue_path(self) -> Path:
        return self.folder / f"{self.stem}.wav"

    def write_line(self, index: int, name: str, wav: np.ndarray) -> Written:
        path = self.path(index, name)
        data = wav_bytes(wav)
        still_ours = None if self.token is None else lambda: check_holds(self.lock_path, self.token, self.who, path)
        write_atomic(path, lambda f: f.write(data), self.who, still_ours)
        return Written(path.name, int(np.size(wav)), digest(data))

    def join_lines(self, names: list[str], pause_seconds: float) -> Path:
        """`{prefix}.wav`: the lines 1..len(names) joined with pauses, a file at a time so it need not fit in memory."""
        import soundfile

        pause = int(round(pause_seconds * SAMPLE_RATE))
        paths = [str(self.path(i + 1, name)) for i, name in enumerate(names)]
        lengths = [soundfile.info(path).frames for path in paths]  # the header, whose form follows the size, first

        def join(f) -> None:
            f.write(wav_header(sum(lengths) + pause * max(len(paths) - 1, 0)))
            for i, path in enumerate(paths):
                if i:
                    f.write(bytes(pause * 4))  # float32 zeros
                clip = soundfile.read(path, dtype="float32")[0]
                if clip.size != lengths[i]:
                    raise RuntimeError(f"{self.who}: {path} changed while the dialogue was joined from it")
                f.write(clip.astype("<f4", copy=False).tobytes())

        write_atomic(self.dialogue_path, join, self.who)
        return self.dialogue_path

    def write_text(self, path: Path, text: str) -> None:
        write_atomic(path, lambda f: f.write(text.encode("utf-8")), self.who)


class LineStore(LineFiles):
    """The line files and the manifest `{prefix}_lines.json` of what each was rendered from, with its length and hash.
    Open it with `with`: one job at a time per folder and prefix (job_lock.py); `what` names this job to one refused."""

    def __init__(self, root: Path, prefix: str, who: str, what: str = "", words: Words = FOR_PYTHON):
        super().__init__(root, prefix, who, words)
        self.manifest_path = self.folder / f"{self.stem}{MANIFEST_SUFFIX}"
        self.lock = JobLock(self.lock_path, who, what or f"{who} writing {self.prefix}")
        self.lines: dict[int, dict] = {}  # this run's lines: reused or rendered
        self.earlier: dict[int, dict] = {}
        # What a rerun found and renders again, by why (one status line says so)
        self.changed = 0  # recorded from another text, voice, model or settings
        self.unrecorded = 0  # written by a run that stopped before recording them
        self.altered = 0  # recorded, but the file is no longer what was recorded

    def __enter__(self) -> "LineStore":
        self._made = [f for f in (self.folder, *self.folder.parents) if not f.exists()]  # deepest first
        self.lock.acquire()  # creates the folder
        try:
            self.earlier = self._read_manifest()
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._leave()

    def _leave(self) -> None:
        """Let go of the folder, and remove the folders this job made if nothing was written into them."""
        self.lock.release()
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # not empty (or another job's now): kept
                break

    def _read_manifest(self) -> dict[int, dict]:
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("%s: %s is unreadable (%s); rendering every line again", self.who, self.manifest_path, e)
            return {}
        if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION \
                or not isinstance(manifest.get("lines"), dict):
            log.warning("%s: %s was written by another version of the pack; rendering every line again", self.who,
                        self.manifest_path)
            return {}
        return {int(k): v for k, v in manifest["lines"].items() if k.isdigit() and isinstance(v, dict)}

    def _held(self) -> None:
        if not self.lock.held:
            raise RuntimeError(f"{self.who}: the line store of {self.prefix} is used outside its `with` block")

    def load(self, index: int, name: str, fingerprint: str) -> np.ndarray | None:
        """The line's audio from an earlier run, or None: no file, another fingerprint, or not the file recorded."""
        import soundfile

        self._held()
        path = self.path(index, name)
        entry = self.earlier.get(index)
        if not path.is_file():
            return None
        if entry is None or entry.get("file") != path.name:
            self.unrecorded += 1
            return None
        if entry.get("fingerprint") != fingerprint:
            self.changed += 1
            return None
        try:
            data = path.read_bytes()
            wav, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=False)
        except Exception as e:  # soundfile raises its own error types for damaged files
            log.warning("%s: cannot read %s (%s); rendering it again", self.who, path.name, e)
            self.altered += 1
            return None
        if digest(data) != entry.get("sha256") or rate != SAMPLE_RATE or wav.ndim != 1 \
                or wav.size != entry.get("samples"):
            self.altered += 1
            return None
        self.lines[index] = entry
        return np.ascontiguousarray(wav, dtype=np.float32)

    def record(self, written: list[tuple[int, str, str, str, Written]]) -> None:
        """Line files already written, as (index, name, text, fingerprint, Written): into the manifest, written once."""
        self._held()
        for index, name, text, fingerprint, file in written:
            self.lines[index] = dict(file=file.file, name=name, text=text, fingerprint=fingerprint,
                                     samples=file.samples, sha256=file.sha256)
        self._write_manifest()

    def finish(self, count: int, srt: str) -> None:
        """The subtitles, and the manifest of exactly this script's lines; temporary files a killed writer left go."""
        self._held()
        self.lines = {i: e for i, e in self.lines.items() if i <= count}
        # every write is over and the lock keeps others out; one listing, not a glob a line (quadratic)
        files = {entry["file"] for entry in self.lines.values()}
        for stray in self.folder.glob(".*.part"):  # morph/lines/files.py write_atomic: .{file}.{writer}.part
            if stray.name[1:-len(".part")].rsplit(".", 1)[0] in files:
                stray.unlink(missing_ok=True)
        self.write_text(self.folder / f"{self.stem}.srt", srt)
        self._write_manifest()

    def _write_manifest(self) -> None:
        # Lines finish longest first; the manifest lists them in script order, whatever order they came in.
        manifest = {"version": MANIFEST_VERSION, "lines": {f"{i:04d}": self.lines[i] for i in sorted(self.lines)}}
        self.write_text(self.manifest_path, json.dumps(manifest, indent=1, ensure_ascii=False))
