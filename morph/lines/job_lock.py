"""One job at a time per output folder and prefix (docs/scripts.md): an OS file lock, released when its holder's
process ends, however it ends; a newcomer's refusal names the holder. A distributed job's workers may outlive a killed
driver, so each checks the file's token, new at each acquire, before each rename (`check_holds`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

if sys.platform == "win32":
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


class JobBusy(RuntimeError):
    """Another live job holds the lock; the message names it."""


class FolderTakenOver(RuntimeError):
    """A job's worker found that its job no longer holds the folder: it writes nothing more there."""


class JobLock:
    """Held from `acquire()` until `release()` or the process's end. `what` names the job in the lock file; `who`
    starts the refusal message."""

    def __init__(self, path: Path, who: str, what: str):
        self.path, self.who, self.what = Path(path), who, what
        self._file = None
        self.token: str | None = None  # this holding's, while held

    def acquire(self) -> "JobLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            f = open(self.path, "a+", encoding="utf-8")
            f.seek(0)  # Windows locks bytes from the file's position: every job locks the first
            if not _try_lock(f.fileno()):
                holder = _describe(self.path)
                f.close()
                raise JobBusy(f"{self.who}: another job is writing these files ({holder}); wait for it to finish, or "
                              f"give this one another output folder or prefix")
            # If the holder before us removed the file between our open and lock, we locked a name nobody sees: retry.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino:
                    break
            f.close()
        f.seek(0)
        f.truncate()
        token = secrets.token_hex(16)
        # After the locked first byte, which Windows lets no other process read
        f.write("\n" + json.dumps(dict(pid=os.getpid(), host=socket.gethostname(), what=self.what,
                                       since=time.strftime("%Y-%m-%d %H:%M:%S"), token=token)))
        f.flush()
        self._file, self.token = f, token
        return self

    def release(self) -> None:
        if self._file is None:
            return
        f, self._file, self.token = self._file, None, None
        # Removed while still held, so no newcomer ever locks a file that is about to disappear.
        with contextlib.suppress(OSError):  # Windows keeps an open file; the next holder overwrites it
            os.unlink(self.path)
        f.close()  # closing lets go of the lock

    @property
    def held(self) -> bool:
        return self._file is not None


def check_holds(path: Path, token: str, who: str, writing: Path) -> None:
    """Raise FolderTakenOver unless the lock file at `path` still holds `token`, the job that gave it out."""
    holder = _holder(path)
    if holder is None or holder.get("token") != token:
        now = f"now {_describe(path)}" if holder is not None else "no job holds it now"
        raise FolderTakenOver(f"{who}: this worker's job no longer holds {path.parent} ({now}): {writing.name} is not "
                              "written there; the job was stopped or another job took the folder over, which "
                              "renders the lines itself")


def _holder(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            f.seek(1)
            holder = json.loads(f.read())
    except (OSError, ValueError):  # none, or a new holder still writing its name
        return None
    return holder if isinstance(holder, dict) else None


def _describe(path: Path) -> str:
    holder = _holder(path)
    try:
        return f"{holder['what']}, process {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (KeyError, TypeError):  # it is still writing its name
        return f"its lock is {path}"
