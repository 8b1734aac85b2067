"""The server's saved voices: the pack's voice files (morph/lines/voice.py), one `<name>.safetensors` each in a
folder, handed out as their bytes, checked without torch. A saved name is never replaced: a new voice is reserved while
it is made, then linked into place, so of two uploads of one name one is refused. Safe from several threads at once."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

from ..lines.files import LineWriteError, write_atomic
from ..lines.voice import FORMAT, VERSION, check_voice

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
CACHE_SIZE = 64  # voices kept in memory; a voice file is tens of kB, and a request reads its voice each time
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name) -> str:
    """A voice name is a file name too: characters safe on every system, no way out of the folder; else ValueError."""
    if not _is_name(name):
        raise ValueError(f"name: {name!r} is not a voice name; use 1-64 letters, digits, '_', '-' or '.', "
                         "starting with a letter or digit")
    return name


def _is_name(name) -> bool:
    return isinstance(name, str) and bool(_NAME.fullmatch(name)) and ".." not in name


class VoiceFolder:
    def __init__(self, path: Path):
        self.path = Path(os.path.abspath(path))
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[tuple[int, int, int], bytes]] = OrderedDict()  # name -> (file key, voice)
        self._warned: set[tuple[str, int]] = set()  # (file name, mtime_ns) of non-voice files already logged
        self._reserved: set[str] = set()  # names whose voices are being made (reserve)

    check_name = staticmethod(check_name)  # the same check, for callers that hold only the folder

    def path_of(self, name: str) -> Path:
        path = self.path / f"{check_name(name)}{SUFFIX}"
        # check_name already keeps a name inside; checked again by the path itself, lexically so that a voice file
        # the user linked in from elsewhere still loads
        assert Path(os.path.normpath(path)).parent == self.path, f"voice path {path} is outside {self.path}"
        return path

    @contextlib.contextmanager
    def reserve(self, name: str):
        """Hold `name` while its voice is made (saved or not); FileExistsError if a voice or another upload has it."""
        path = self.path_of(name)
        with self._lock:
            if name in self._reserved or path.exists():
                raise FileExistsError(name)
            self._reserved.add(name)
        try:
            yield
        finally:
            with self._lock:
                self._reserved.discard(name)

    def save(self, name: str, voice: bytes) -> dict:
        """Save a new voice whole (write_atomic, exclusive) and return its record; FileExistsError if `name` has one."""
        path = self.path_of(name)
        try:
            # flushed and synced: on disk before the link, so a power cut cannot leave an empty voice
            write_atomic(path, lambda f: (f.write(voice), f.flush(), os.fsync(f.fileno())), f"voice {name!r}",
                         exclusive=True)
        except LineWriteError as e:
            cause = e.__cause__
            raise RuntimeError(f"voice {name!r}: could not write {path}: {cause.strerror or cause}; check the voice "
                               "folder's permissions and free space (cli.py serve --voices)") from cause
        return _record(name, path)

    def load(self, name: str) -> bytes:
        """The voice saved as `name` (ValueError if not a voice), read again once its file changes; KeyError if none."""
        path = self.path_of(name)
        try:
            key = _file_key(path)
        except FileNotFoundError:
            raise KeyError(name) from None
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and cached[0] == key:
                self._cache.move_to_end(name)
                return cached[1]
        try:  # read outside the lock: other requests' voices need not wait for this file
            voice = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):  # deleted since the stat, or a folder named like a voice
            raise KeyError(name) from None
        check_voice(voice, f"voice {name!r}", path.name)
        with self._lock:
            self._cache[name] = (key, voice)
            self._cache.move_to_end(name)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return voice

    def names(self) -> list[str]:
        """The saved voices' names, sorted, from their file names alone."""
        return sorted(name for name, _ in self._files() if _is_name(name))

    def records(self) -> list[dict]:
        """Each saved voice, by name, from the files' metadata only (the tensors are not read). Files that are not
        voices, or whose names the API could not ask for, are skipped, with one warning per file."""
        records = []
        for name, path in self._files():
            try:
                records.append(_record(check_name(name), path))
            except FileNotFoundError:  # deleted while listing
                continue
            except ValueError as e:
                self._warn_once(path, e)
        return sorted(records, key=lambda record: record["name"])  # not by file name: "a-b.s..." sorts before "a.s..."

    def delete(self, name: str) -> bool:
        path = self.path_of(name)
        with self._lock:
            self._cache.pop(name, None)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _files(self):
        """(name, path) of each file named like a voice."""
        return ((path.name[: -len(SUFFIX)], path) for path in self.path.glob(f"*{SUFFIX}"))

    def _warn_once(self, path: Path, error: ValueError) -> None:
        """records() runs on every voice listing: a stray file is reported once, and again only if it changes."""
        try:
            seen = (path.name, path.stat().st_mtime_ns)
        except FileNotFoundError:
            return
        with self._lock:
            if seen in self._warned:
                return
            self._warned.add(seen)
        log.warning("voice folder %s: skipping %s: %s", self.path, path.name, error)


def _file_key(path: Path) -> tuple[int, int, int]:
    """What changes when a voice file is replaced: the inode too (a rename in the clock's tick can keep mtime, size)."""
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _record(name: str, path: Path) -> dict:
    """A voice's listing from its file's metadata; ValueError if the file is not a voice file."""
    from safetensors import SafetensorError, safe_open

    created_at = int(path.stat().st_mtime)
    try:
        with safe_open(str(path), framework="numpy") as f:  # "pt" would import torch
            metadata = f.metadata() or {}
        ref_text = json.loads(metadata.get("ref_text", "null"))
    except FileNotFoundError:
        raise
    except (SafetensorError, OSError, json.JSONDecodeError) as e:  # OSError: a folder named like a voice file
        raise ValueError(f"not a safetensors voice file ({e})") from e
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} voice file (format {metadata.get('format')!r}, "
                         f"version {metadata.get('version')!r})")
    if metadata.get("mode") not in ("icl", "xvector"):
        raise ValueError(f"unknown voice mode {metadata.get('mode')!r}")
    return {"name": name, "mode": metadata["mode"], "ref_text": ref_text, "model_size": metadata.get("model_size", ""),
            "created_at": created_at}
