"""A pool whose worker finds its disk full at its third line file, as a real full disk fails: an OSError(ENOSPC) from
inside the line store's atomic write. Ray's workers import this module by name (the tests package travels along)."""

import errno
import os

from morph.distributed.job import WorkerPool
from morph.distributed.worker import LineWorker
from morph.lines.files import write_atomic
from morph.lines.store import LineFiles


class FullDiskFiles(LineFiles):
    written = 0  # line files this worker process wrote

    def write_line(self, index, name, wav):
        FullDiskFiles.written += 1
        if FullDiskFiles.written < 3:
            return super().write_line(index, name, wav)

        def full(f):
            f.write(b"RIFF")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        write_atomic(self.path(index, name), full, self.who)


class FullDiskWorker(LineWorker):
    def render(self, batch, files, *rest):
        return super().render(batch, FullDiskFiles(files.root, files.prefix, files.who), *rest)


class FullDiskPool(WorkerPool):
    worker = FullDiskWorker
