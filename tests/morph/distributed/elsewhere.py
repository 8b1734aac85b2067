"""A pool whose workers write where the driver does not look, as a worker on another machine writes into its own
disk when --out is not shared. Ray's workers import this module by name (the tests package travels with the pool)."""

from morph.distributed.job import WorkerPool
from morph.distributed.worker import LineWorker
from morph.lines.store import LineFiles


class ElsewhereWorker(LineWorker):
    def render(self, batch, files, *rest):
        return super().render(batch, LineFiles(files.root / "another-machine", files.prefix, files.who), *rest)


class ElsewherePool(WorkerPool):
    worker = ElsewhereWorker
