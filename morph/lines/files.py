"""How the line store puts a file on disk: whole or not at all, under a temporary name no other writer shares, and
a failure that says which file, why, and leaves no partial file behind.

The WAV bytes are made here rather than by libsndfile writing to disk, whose failures read "System error." with no
file and no cause (a full disk included); Python's own writes raise OSError with both.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import struct
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from ..settings import SAMPLE_RATE

MAX_WAV_BYTES = 0xFFFF_FFFF - 64  # a RIFF file's sizes are 32-bit: about 12 hours of float32 mono at 24 kHz

_FIXES = {errno.ENOSPC: "free some space on its disk", errno.EDQUOT: "free some of your disk quota",
          errno.EACCES: "make the folder writable, or choose another", errno.EPERM: "make the folder writable, or "
          "choose another", errno.EROFS: "the disk is read-only: choose another folder",
          errno.ENOENT: "the folder was removed while the job ran: make it again, or choose another"}


class LineWriteError(OSError):
    """A file of the line store could not be written; the message names the file, the cause and the fix."""


def wav_header(samples: int) -> bytes:
    """A mono float32 WAV header at SAMPLE_RATE for `samples` samples (format 3, IEEE float, with its fact chunk)."""
    data = samples * 4
    if data > MAX_WAV_BYTES:
        raise ValueError(f"{samples / SAMPLE_RATE / 3600:.1f} hours of audio do not fit in one WAV file (at most "
                         f"{MAX_WAV_BYTES / 4 / SAMPLE_RATE / 3600:.1f}); render the script in parts")
    fmt = struct.pack("<HHIIHH", 3, 1, SAMPLE_RATE, SAMPLE_RATE * 4, 4, 32)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 12 + 8 + data) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"fact" + struct.pack("<II", 4, samples)
            + b"data" + struct.pack("<I", data))


def wav_bytes(wav: np.ndarray) -> bytes:
    """One clip as a whole WAV file's bytes (float32, so a reused line is the exact audio)."""
    samples = np.ascontiguousarray(wav, dtype="<f4").reshape(-1)
    return wav_header(samples.size) + samples.tobytes()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(path: Path, write: Callable[[BinaryIO], None], who: str) -> None:
    """`write(f)` into a temporary file beside `path`, then renamed over it: a reader sees the old file or the new one,
    never part of one. The temporary name is this writer's own (its process and a random part), so two writers never
    write into one file. Whatever stops the write, the temporary file is removed. No fsync: a line file that a power
    cut leaves torn no longer matches the SHA-256 its manifest entry records, and is rendered again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            fix = _FIXES.get(e.errno, "check the folder's permissions and free space, or choose another folder")
            raise LineWriteError(f"{who}: could not write {path}: {e.strerror or e}; {fix}") from e
        raise
