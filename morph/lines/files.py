"""How the line store puts a file on disk: whole or not at all (`write_atomic`), a failure naming the file, its cause
and the fix. The WAV bytes are made here, as libsndfile's write failures name neither file nor cause."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import struct
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from ..settings import SAMPLE_RATE

RIFF_LIMIT = 0xFFFF_FFFF  # a RIFF chunk's size is 32-bit: about 12.4 hours of float32 mono at 24 kHz
_FMT = struct.pack("<HHIIHH", 3, 1, SAMPLE_RATE, SAMPLE_RATE * 4, 4, 32)  # IEEE float, mono, 32-bit

_FIXES = {errno.ENOSPC: "free some space on its disk", errno.EDQUOT: "free some of your disk quota",
          errno.EACCES: "make the folder writable, or choose another", errno.EPERM: "make the folder writable, or "
          "choose another", errno.EROFS: "the disk is read-only: choose another folder",
          errno.ENOENT: "the folder was removed while the job ran: make it again, or choose another"}


class LineWriteError(OSError):
    """A file of the line store could not be written; the message names the file, the cause and the fix."""


def wav_header(samples: int) -> bytes:
    """A mono float32 WAV header of `samples` samples, RF64 past RIFF's sizes (docs/scripts.md, Long scripts)."""
    data = samples * 4
    riff = 4 + 8 + len(_FMT) + 12 + 8 + data  # the file's size less RIFF's own 8 bytes
    if riff <= RIFF_LIMIT:
        return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
                + b"fmt " + struct.pack("<I", len(_FMT)) + _FMT
                + b"fact" + struct.pack("<II", 4, samples)
                + b"data" + struct.pack("<I", data))
    ds64 = struct.pack("<QQQI", riff + 36, data, samples, 0)  # RIFF, data and fact sizes; no table
    return (b"RF64" + struct.pack("<I", RIFF_LIMIT) + b"WAVE"
            + b"ds64" + struct.pack("<I", len(ds64)) + ds64
            + b"fmt " + struct.pack("<I", len(_FMT)) + _FMT
            + b"fact" + struct.pack("<II", 4, min(samples, RIFF_LIMIT))
            + b"data" + struct.pack("<I", RIFF_LIMIT))


def wav_bytes(wav: np.ndarray) -> bytes:
    """One clip as a whole WAV file's bytes (float32, so a reused line is the exact audio)."""
    samples = np.ascontiguousarray(wav, dtype="<f4").reshape(-1)
    return wav_header(samples.size) + samples.tobytes()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, write: Callable[[BinaryIO], None], who: str,
                 still_ours: Callable[[], None] | None = None, exclusive: bool = False) -> None:
    """`write(f)` into a temporary file of this writer's own beside `path`, then renamed over it, so a reader never
    sees part of one; `still_ours()`, right before the rename, raises if the job lost the folder. No fsync: a file a
    power cut tears no longer matches its manifest's SHA-256 and is rendered again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            write(f)
        if still_ours is not None:
            still_ours()
        if exclusive:  # a link, unlike a rename, never replaces a file: FileExistsError if `path` has one
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, FileExistsError):
            fix = _FIXES.get(e.errno, "check the folder's permissions and free space, or choose another folder")
            raise LineWriteError(f"{who}: could not write {path}: {e.strerror or e}; {fix}") from e
        raise


def check_space(folder: Path, need: int, who: str, fix: str) -> None:
    """Refuse, before any work, a job whose files (about `need` bytes) do not fit on `folder`'s disk."""
    free = shutil.disk_usage(folder).free
    if need > free:
        raise LineWriteError(f"{who}: this job writes about {_size(need)} into {folder}, and its disk has "
                             f"{_size(free)} free; free some space there, or {fix}")


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
