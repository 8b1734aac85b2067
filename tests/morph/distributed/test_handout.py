"""WorkerPool.render against a scripted fake Ray (no Ray, no model, a fake clock: nothing sleeps): both workers are
SIGKILLed while rendering their first batches, then Ray restarts them. A restarting worker gets no batch until its
probe answers, a batch refused by a restarting worker costs no try, and every line ends up written once. Before the
fix, a worker was taken back when its probe was sent, so the requeued batches bounced between the two restarting
workers and the job stopped with 'a batch ... was lost with its worker 3 times' after one real loss."""

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np

from morph.distributed import job as distributed
from morph.lines.line import Line
from morph.lines.script import parse_script
from morph.lines.store import LineStore
from morph.script_job import ScriptJob
from morph.settings import GenerationSettings

# The scenario, in fake seconds. Both workers are killed at KILLED, each in its first batch. Ray reports a worker's
# calls then in flight when it notices the death (the running batch: ActorDiedError; the one queued behind it, never
# started: ActorUnavailableError), and refuses every call sent while it restarts with ActorUnavailableError, REFUSE
# after the call: later than the driver's next probe (PROBE), the order that made the old driver bounce batches.
#         death reported   restarting until (a probe sent from then on answers)
WORKERS = {"A": (0.25, 3.0),
           "B": (0.6, 3.0)}
KILLED, RENDER, ANSWER, REFUSE, PROBE = 0.2, 0.5, 0.01, 0.15, 0.1
TEXTS = ["Hello there.", "Hi!", "How are you today?", "Fine.", "Lovely weather.", "Yes.", "A walk?", "Why not.",
         "The long way round.", "Good."]
SCRIPT = "".join(f"{'Alice' if i % 2 else 'Bob'}: {text}\n" for i, text in enumerate(TEXTS))


class RayActorError(Exception):
    pass


class ActorDiedError(RayActorError):  # as in ray.exceptions: both kinds are RayActorErrors
    pass


class ActorUnavailableError(RayActorError):
    pass


class RayTaskError(Exception):
    def __init__(self, cause):
        super().__init__(str(cause))
        self.cause = cause


class Ref:
    count = 0

    def __init__(self, worker, method, at, outcome):
        self.worker, self.method, self.at, self.outcome = worker, method, at, outcome
        Ref.count += 1
        self.seq = Ref.count  # refs ready at the same time come back in the order sent


class FakeRay:
    exceptions = SimpleNamespace(RayTaskError=RayTaskError, RayActorError=RayActorError,
                                 ActorDiedError=ActorDiedError, ActorUnavailableError=ActorUnavailableError)

    def __init__(self):
        self.now, self.rendered, self.misdirected, self.deaths = 0.0, Counter(), [], 0

    def wait(self, refs, num_returns=1, timeout=None):
        first = min(refs, key=lambda r: (r.at, r.seq), default=None)
        if first is None or (timeout is not None and first.at > self.now + timeout):
            assert timeout is not None, "the driver would wait forever"
            self.now += timeout
            return [], refs
        self.now = max(self.now, first.at)
        return [first], [r for r in refs if r is not first]

    def get(self, ref):
        self.now = max(self.now, ref.at)
        if isinstance(ref.outcome, RayActorError):
            ref.worker.down = True  # the driver has seen it lost
            self.deaths += isinstance(ref.outcome, ActorDiedError)
            raise ref.outcome
        if ref.method == "about":
            ref.worker.down = False  # its probe answered: it may have batches again
        return ref.outcome()


class Worker:
    def __init__(self, ray, name):
        self.ray, self.name, self.free, self.down = ray, name, 0.0, False
        self.reported, self.back = WORKERS[name]
        self.about = SimpleNamespace(remote=lambda: self.call("about", lambda: dict(host=name)))
        self.check = SimpleNamespace(remote=lambda *args: self.call("check", lambda: None))
        self.render = SimpleNamespace(remote=self.send_render)

    def send_render(self, rows, files, settings, finish_line, who, labels, width):
        def render():  # as LineWorker.render: each line's file written, (index, Written) back
            self.ray.rendered.update(i for i, _, _ in rows)
            return [(i, files.write_line(i + 1, name, np.full(100 + i, 0.1, np.float32))) for i, name, _ in rows]

        if self.down:  # sent to a worker the driver saw lost, before its probe answered
            self.ray.misdirected.append((self.name, [i for i, _, _ in rows], self.ray.now))
        return self.call("render", render)

    def call(self, method, work):
        now = self.ray.now
        if KILLED <= now < self.back:
            return Ref(self, method, now + REFUSE, ActorUnavailableError(f"worker {self.name} is restarting"))
        start = max(now, self.free)  # a worker runs its calls one after another, in the order sent
        self.free = start + (RENDER if method == "render" else ANSWER)
        if start < KILLED < self.free:
            return Ref(self, method, self.reported, ActorDiedError(f"worker {self.name} died"))
        if now < KILLED <= start:
            return Ref(self, method, self.reported, ActorUnavailableError(f"worker {self.name} is restarting"))
        return Ref(self, method, self.free, work)


def run_scenario(module, folder, monkeypatch):
    """The scenario through `module`'s WorkerPool.render (job.py, or an older copy); returns the fake Ray and the
    on_step calls."""
    ray = FakeRay()
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: ray.now))
    monkeypatch.setattr(module, "PROBE_SECONDS", PROBE)
    pool = module.WorkerPool.__new__(module.WorkerPool)  # no cluster, no model: only what render uses
    pool.ray, pool.who = ray, "test"
    pool.actors = [Worker(ray, name) for name in WORKERS]
    pool.about = [dict(host=name) for name in WORKERS]
    parsed, steps = parse_script(SCRIPT, ["Alice", "Bob"]), []
    with LineStore(folder, "s", "test") as store:
        job = ScriptJob(parsed, [Line(p.text, instruct=f"{p.name}'s voice.") for p in parsed], store,
                        {"model": "fake"}, rerun="run it again")
        pool.render(job, GenerationSettings(max_new_tokens=4), batch_size=2, pause_seconds=0.1,
                    on_step=lambda done, total: steps.append((done, total)))
    return ray, steps


def test_both_workers_killed_and_restarting_lose_one_try_each_and_no_line(tmp_path, monkeypatch):
    ray, steps = run_scenario(distributed, tmp_path, monkeypatch)
    assert ray.deaths == 2 and ray.now > max(back for _, back in WORKERS.values())  # the scenario ran as written
    assert ray.misdirected == []  # no batch to a worker seen lost before its probe answered
    assert ray.rendered == Counter(range(len(TEXTS)))  # each line rendered once, by a live worker
    lines = json.loads((tmp_path / "s_lines.json").read_text())["lines"]
    assert sorted(lines) == [f"{i:04d}" for i in range(1, len(TEXTS) + 1)]
    assert sorted(p.name for p in tmp_path.glob("s_*.wav")) == sorted(e["file"] for e in lines.values())
    assert all(e["samples"] == 100 + int(k) - 1 for k, e in lines.items())
    assert not list(tmp_path.rglob("*.part*")) and (tmp_path / "s.wav").is_file() and (tmp_path / "s.srt").is_file()
    done = [d for d, _ in steps]  # once per batch back: five batches of two lines
    assert len(steps) == 5 and done == sorted(set(done)) and done[-1] == steps[-1][1]
