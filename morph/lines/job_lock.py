"""One job at a time per output folder and prefix: a lock file the operating system releases when its holder's
process ends, however it ends (a crash, `kill -9`, a lost machine's NFS client), so a dead job's lock is taken
over by the next one without a word and a live one's refuses the newcomer with who holds it.

Two jobs on one line store would interleave their writes: one line's file from the first job under the second
job's manifest entry. The lock file names its holder (process, machine, what it runs, since when) for that refusal;
it is removed when the holder lets go.
"""

from __future__ import annotations

import json
import os
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


class JobLock:
    """Held from `acquire()` until `release()` (or the process's end). `what` names the job in the lock file, e.g.
    'cli.py render scene1.txt'; `who` starts the refusal message."""

    def __init__(self, path: Path, who: str, what: str):
        self.path, self.who, self.what = Path(path), who, what
        self._file = None

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
            # The holder before us may have removed the file between our open and our lock: then we hold a lock on
            # a name nobody else sees, so take the file that is there now.
            try:
                same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(json.dumps(dict(pid=os.getpid(), host=socket.gethostname(), what=self.what,
                                since=time.strftime("%Y-%m-%d %H:%M:%S"))))
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is None:
            return
        f, self._file = self._file, None
        # Removed while still held, so no newcomer ever locks a file that is about to disappear.
        try:
            os.unlink(self.path)
        except OSError:  # Windows keeps an open file; the next holder overwrites it
            pass
        f.close()  # closing lets go of the lock

    @property
    def held(self) -> bool:
        return self._file is not None


def _describe(path: Path) -> str:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return f"{holder['what']}, process {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):  # it is still writing its name
        return f"its lock is {path}"
