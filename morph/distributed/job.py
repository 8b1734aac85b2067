"""A script over many GPUs and machines with Ray (docs/scripts.md, Several GPUs): a worker per GPU, and a driver that
plans the batches as one GPU would and hands them out as workers free up, IN_FLIGHT at each. Workers write their
lines' files; the driver keeps the manifest, the dialogue and the subtitles. A worker that dies is restarted by Ray
and its batch requeued; a batch lost MAX_TRIES times, or no worker left, stops the job with the lines done kept."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..lines.files import LineWriteError
from ..lines.store import LineFiles
from ..lines.words import FOR_PYTHON, Words
from ..render import Line, OnStep, plan_batches
from ..script_job import ScriptJob
from ..settings import GenerationSettings
from .worker import LineWorker

log = logging.getLogger(__name__)

RAY_INSTALL = "pip install 'ray>=2.40' (or pip install '.[ray]' in the pack's folder), with the same Python"
MAX_RESTARTS = 2  # a worker process that dies is started again (the model reloaded) this often
MAX_TRIES = 3  # a batch lost with its worker this often stops the job
IN_FLIGHT = 2  # batches queued at each worker, so it never waits for the driver between two
PROBE_SECONDS = 1.0  # how often a restarting worker is asked whether it is back


def plan(indices: Sequence[int], lines: Sequence[Line], settings: GenerationSettings,
         batch_size: int) -> list[list[int]]:
    """The batches of these lines as lists of their indices, planned as on one GPU (plan_batches)."""
    indices = list(indices)
    texts = [lines[i].text.strip() for i in indices]
    batches = plan_batches([(settings.frame_limit(text), text) for text in texts], batch_size)
    return [[indices[k] for k in batch] for batch in batches]


def import_ray(flag: str):
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"{flag} needs Ray, which is not installed here: {RAY_INSTALL}") from e
    return ray


class WorkerPool:
    """`workers` LineWorkers on a Ray cluster, one GPU each (one CPU with device="cpu" in `load`, MorphTTS.load's
    keywords): a local cluster started here, or the one at `address`; `workers=None` takes every GPU. `packages` are
    the front end's own, shipped to the workers with morph (where `finish_line` lives)."""

    worker = LineWorker  # what each actor runs (a benchmark's subclass holds EOS back on random weights)

    def __init__(self, workers: int | None, load: dict, address: str | None = None, who: str = "Render lines",
                 packages: Sequence = ()):
        ray = self.ray = import_ray("--gpus" if address is None else "--address")
        self.who, self.started = who, address is None
        cpu = load.get("device") == "cpu"
        if ray.is_initialized():
            raise RuntimeError(f"{who}: Ray is already initialized in this process; one pool at a time")
        import morph

        # Ray copies the pack's code to every node; the model and its libraries must be installed on each one.
        modules = [str(Path(m.__file__).parent) for m in (morph, *packages)]
        try:
            # "local": a cluster of its own even beside a `ray start` one on this machine, which address=None joins
            # (and then refuses num_cpus)
            ray.init(address="local" if self.started else address,
                     num_cpus=max(workers or 1, os.cpu_count() or 1) if self.started else None, include_dashboard=False,
                     logging_level=logging.WARNING, runtime_env={"py_modules": modules})
        except ConnectionError as e:  # Ray 2.59+ clusters started by `ray start` want their token
            raise ConnectionError(f"{who}: could not join the Ray cluster at {address} ({e}); if its `ray start "
                                  "--head` said token authentication is enabled (Ray 2.59 and later), set "
                                  "RAY_AUTH_MODE=token here, and RAY_AUTH_TOKEN to what `ray get-auth-token` prints "
                                  "on the head") from None
        try:
            have = int(ray.cluster_resources().get("CPU" if cpu else "GPU", 0))
            kind = "CPUs" if cpu else "GPUs"
            workers = workers or have
            if not have:
                raise RuntimeError(f"{who}: the Ray cluster has no GPU; render with --device cpu (CPU workers), or "
                                   "join a cluster with GPUs (--address)")
            if workers < 1 or workers > have:
                raise RuntimeError(f"{who}: {workers} workers asked for, and the Ray cluster has {have} {kind}; "
                                   f"ask for at most {have}")
            # threaded: a worker's batches in flight wait on its engine together (worker.py), beside a probe
            remote = ray.remote(self.worker).options(num_gpus=0 if cpu else 1, num_cpus=1, max_restarts=MAX_RESTARTS,
                                                     max_task_retries=0, max_concurrency=IN_FLIGHT + 1)
            self.actors = [remote.remote(load) for _ in range(workers)]
            try:
                self.about = ray.get([a.about.remote() for a in self.actors])  # every model loaded, or its error
            except ray.exceptions.RayActorError as e:  # the load failed (Ray tried it MAX_RESTARTS times more)
                cause = [line for line in str(e).splitlines() if line.strip()][-1].strip()
                raise RuntimeError(f"{who}: a worker could not load the model: {cause}; on a cluster, the model "
                                   "and the pack's requirements must be on every machine") from None
        except BaseException:
            self.close()
            raise
        log.info("%s: %d workers ready (%s)", who, workers,
                 ", ".join(f"{a['device']} on {a['host']}" for a in self.about))

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers, and the local cluster if this pool started one."""
        for actor in getattr(self, "actors", ()):
            self.ray.kill(actor)
        self.ray.shutdown()

    # -- what the first worker answers for all ------------------------------------------------------------
    @property
    def variant(self) -> str:
        return self.about[0]["variant"]

    def context(self, language: str, settings: GenerationSettings, smoothing: bool) -> dict:
        return self._first("context", language, settings, smoothing)

    def voice_from_clip(self, clip: np.ndarray, transcript: str | None = None, who: str = "make_voice"):
        return self._first("voice_from_clip", clip, transcript, who)

    def _first(self, method: str, *args):
        try:
            return self.ray.get(getattr(self.actors[0], method).remote(*args))
        except self.ray.exceptions.RayTaskError as e:
            raise e.cause from None  # the engine's own error (a bad clip, say), with its message

    def render(self, job: ScriptJob, settings: GenerationSettings, batch_size: int, pause_seconds: float,
               finish_line: Callable[[np.ndarray], np.ndarray] | None = None, on_step: OnStep | None = None,
               on_lines: Callable[[list[tuple[int, int]]], None] | None = None,
               words: Words = FOR_PYTHON) -> str:
        """Render the job's lines still to do over the pool, then write its dialogue, subtitles and manifest; returns
        the subtitles. `on_lines([(script index, samples)])` follows each batch's files; `finish_line` runs on the
        workers (picklable)."""
        ray, who, todo = self.ray, self.who, job.todo()
        job.check_space(pause_seconds, True, words)
        if todo:
            self._first("check", [job.lines[i] for i in todo], settings, who, job.labels(todo))
        queue = deque(plan(todo, job.lines, settings, batch_size))
        slots = {tuple(b): len(b) * max(settings.frame_limit(job.lines[i].text.strip()) for i in b) for b in queue}
        total, done = max(sum(slots.values()), 1), 0
        # Workers on other machines write under the path as given: a relative one would land where `ray start` ran.
        # The job's token: a worker that outlives this driver writes nothing into a folder another job took over.
        files = LineFiles(Path(job.store.root).absolute(), job.store.prefix, who, token=job.store.lock.token)
        pending, tries, actors = {}, {}, list(self.actors)  # pending: call -> (worker, its batch; None: a probe)
        # A worker Ray is starting again -> when to ask next whether it is back (None: asked, no answer yet); it
        # gets no batch until its probe answers, or each batch sent would come back refused at once
        restarting: dict = {}

        def fill(actor) -> None:
            while queue and sum(1 for a, b in pending.values() if a is actor and b is not None) < IN_FLIGHT:
                batch = queue.popleft()
                rows = [(i, job.parsed[i].name, job.lines[i]) for i in batch]
                call = actor.render.remote(rows, files, settings, finish_line, who, job.labels(batch), batch_size)
                pending[call] = (actor, batch)

        for actor in actors:
            fill(actor)
        while queue or any(batch is not None for _, batch in pending.values()):
            for actor, at in list(restarting.items()):
                if at is not None and at <= time.monotonic():
                    restarting[actor] = None
                    pending[actor.about.remote()] = (actor, None)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=PROBE_SECONDS if restarting else None)
            if not ready:
                continue
            actor = pending[ready[0]][0]
            # The engine takes a worker's batches in the order sent, and pending keeps that order: the oldest batch in
            # flight on this worker is the one it got furthest with (or had, if this call says it died)
            running = next((b for a, b in pending.values() if a is actor and b is not None), None)
            actor, batch = pending.pop(ready[0])
            try:
                rendered = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, LineWriteError):  # a worker's disk: say what is kept and how to go on
                    raise LineWriteError(job.stopped(str(e.cause))) from None
                raise e.cause from None
            except ray.exceptions.RayActorError as e:
                self._lost(e, actor, batch, running, job, queue, tries, restarting, actors)
                for other in actors:  # a requeued batch goes to the first worker with room
                    if other not in restarting:
                        fill(other)
                continue
            if batch is None:  # the probe answered: Ray has the worker running again
                restarting.pop(actor, None)
            else:
                self._check_seen(files, rendered, actor, job)
                job.written(rendered)
                done += slots[tuple(batch)]
                if on_step is not None:
                    on_step(done, total)
                if on_lines is not None:
                    on_lines([(i, file.samples) for i, file in rendered])
            if actor not in restarting:
                fill(actor)
        job.write_dialogue(pause_seconds)
        return job.finish(pause_seconds)

    def _lost(self, e, actor, batch, running, job: ScriptJob, queue: deque, tries: dict, restarting: dict,
              actors: list) -> None:
        """A call whose worker Ray lost or is restarting: its batch goes back to the front of the queue; a worker Ray
        gave up on leaves the pool. A death costs one try, to the batch it was running (`running`, its oldest in
        flight), not to the others it fails."""
        ray, who = self.ray, self.who
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if actor not in restarting and running is not None:  # the first word of this death
            tries[tuple(running)] = tries.get(tuple(running), 0) + 1
            if tries[tuple(running)] >= MAX_TRIES:
                raise RuntimeError(job.stopped(f"{who}: stopped: a batch of {len(running)} lines was lost with "
                                               f"its worker {MAX_TRIES} times ({reason})")) from None
            log.warning("%s: a worker was lost (%s); its lines go back to the queue", who, reason)
        if batch is not None:
            queue.appendleft(batch)
        if isinstance(e, ray.exceptions.ActorUnavailableError) or batch is not None:
            restarting[actor] = time.monotonic() + PROBE_SECONDS  # ask again whether Ray has it back
        elif actor in actors:  # its probe found it dead: Ray has given up on it
            actors.remove(actor)
            restarting.pop(actor, None)
            log.warning("%s: a worker is gone for good (%s); %d left", who, reason, len(actors))
            if not actors:
                raise RuntimeError(job.stopped(f"{who}: stopped: every worker was lost")) from None

    def _check_seen(self, files: LineFiles, rendered: list, actor, job: ScriptJob) -> None:
        unseen = [files.path(i + 1, job.parsed[i].name) for i, _ in rendered]
        unseen = [path.name for path in unseen if not path.is_file()]
        if unseen:  # a worker on another machine wrote into its own disk
            host = self.about[self.actors.index(actor)]["host"]
            raise RuntimeError(f"{self.who}: the worker on {host} wrote {unseen[0]} where this machine does not see "
                               f"it: --out must be a folder every machine of the cluster shares (an NFS or other "
                               f"shared mount); {len(job.lengths)} of {len(job.lines)} lines are in {job.store.folder}")
