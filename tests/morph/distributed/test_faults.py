"""Faults of a script over Ray workers, on real local clusters with the tiny model on the CPU: both workers killed at
once, a disk that fills, a relative --out on a cluster started elsewhere, --gpus beside a `ray start` cluster, and a
rerun with nothing left that starts neither Ray nor the model. Each test stops only the Ray processes it started."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import cli  # noqa: E402
from morph.distributed import job as distributed  # noqa: E402
from morph.lines.files import LineWriteError  # noqa: E402
from morph.lines.script import parse_script  # noqa: E402
from morph.lines.store import LineStore  # noqa: E402
from morph.render import Line  # noqa: E402
from morph.script_job import ScriptJob  # noqa: E402
from morph.settings import GenerationSettings, Sampling  # noqa: E402

from .test_job import SCRIPT, back, options  # noqa: E402

SETTINGS = GenerationSettings(do_sample=False, subtalker=Sampling(do_sample=False), max_new_tokens=6)
CAST = ["--design", "Alice=A warm voice.", "--design", "Bob=A bright voice."]


@pytest.fixture(scope="module")
def design_dir(model_dirs):
    return model_dirs("tiny", "voice_design")


def script_job(folder, context):
    parsed = parse_script(SCRIPT, ["Alice", "Bob"])
    store = LineStore(folder, "s", "test")
    store.__enter__()  # held while the test runs: each job has a folder of its own
    return ScriptJob(parsed, [Line(p.text, instruct=f"{p.name}'s voice.") for p in parsed], store, context,
                     rerun="run the same command again")


def test_both_workers_killed_at_once_lose_no_line_ten_times_over(design_dir, tmp_path, monkeypatch, own_ray):
    # Ray's max_restarts counts over a worker's whole life, not per job: ten rounds of killing both take ten
    # restarts of each, where a real job allows MAX_RESTARTS
    monkeypatch.setattr(distributed, "MAX_RESTARTS", 10)
    load = dict(source=str(design_dir), device="cpu", dtype="fp32", attention="sdpa")
    with distributed.WorkerPool(2, load, who="test") as pool:
        context = pool.context("Auto", SETTINGS, False)
        for round in range(10):
            pids = [back(pool, actor)["pid"] for actor in pool.actors]  # both running (again)
            job, seen, steps = script_job(tmp_path / str(round), context), [], []

            def kill_both(rendered):  # the first batch back: the other worker's batches are in flight
                if not seen:
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                seen.extend(i for i, _ in rendered)

            pool.render(job, SETTINGS, batch_size=1, pause_seconds=0.1, on_lines=kill_both,
                        on_step=lambda done, total: steps.append((done, total)))
            assert sorted(seen) == list(range(10)), round  # every line once, none lost or twice
            folder = tmp_path / str(round)
            manifest = json.loads((folder / "s_lines.json").read_text())["lines"]
            assert sorted(manifest) == [f"{i:04d}" for i in range(1, 11)], round
            assert len(list(folder.glob("s_0*.wav"))) == 10 and not list(folder.glob("*.part")), round
            # progress: one step per batch, each batch counted once, requeued or not
            assert len(steps) == 10 and steps[-1][0] == steps[-1][1], (round, steps)
            assert all(a[0] < b[0] for a, b in zip(steps, steps[1:])), (round, steps)


def test_a_full_disk_on_a_worker_names_the_file_and_keeps_the_lines_done(design_dir, tmp_path, own_ray):
    import tests
    from tests.morph.distributed.full_disk import FullDiskPool

    load = dict(source=str(design_dir), device="cpu", dtype="fp32", attention="sdpa")
    with FullDiskPool(1, load, who="test", packages=[tests]) as pool:
        job = script_job(tmp_path / "out", pool.context("Auto", SETTINGS, False))
        with pytest.raises(LineWriteError) as stop:
            pool.render(job, SETTINGS, batch_size=1, pause_seconds=0.1)
    message = str(stop.value)
    assert message.startswith(f"test: could not write {tmp_path / 'out'}/s_00"), message
    assert ": No space left on device; free some space on its disk; 2 of 10 lines are kept in " in message, message
    assert message.endswith("; run the same command again to render the rest"), message
    manifest = json.loads((tmp_path / "out" / "s_lines.json").read_text())["lines"]
    assert len(manifest) == 2 and all((tmp_path / "out" / line["file"]).is_file() for line in manifest.values())
    assert not list((tmp_path / "out").glob("*.part")) and not list((tmp_path / "out").glob(".*.part"))


def job_env(tmp_path) -> dict:
    """A job's environment: the test's own ~/.ray (no token of the user's), the test's mark inherited."""
    return dict(os.environ, HOME=str(tmp_path / "home"))


def test_a_relative_out_on_a_cluster_started_elsewhere_lands_where_the_job_runs(design_dir, tmp_path, own_ray):
    env = job_env(tmp_path)
    address = own_ray.head(tmp_path / "head", env)  # `ray start` ran in head/, the job runs in job/
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    command = [sys.executable, str(Path(cli.__file__)), "render", "scene.txt", *CAST,
               *options(design_dir, "r", "--batch-size", "4", "--address", address)]
    job = subprocess.run(command, cwd=tmp_path / "job", capture_output=True, text=True, env=env, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    assert len(list((tmp_path / "job" / "r").glob("dialogue_00*.wav"))) == 10
    assert not list((tmp_path / "head").rglob("*.wav"))  # no stray files where the cluster started


def test_gpus_starts_its_own_cluster_beside_a_ray_start_one(design_dir, tmp_path, monkeypatch, capsys, own_ray):
    address = own_ray.head(tmp_path / "head", job_env(tmp_path))
    head = own_ray.processes()
    monkeypatch.setenv("RAY_ADDRESS", address)  # what `ray start` tells its users to set; a plain ray.init joins it
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    argv = ["render", str(tmp_path / "scene.txt"), *CAST, *options(design_dir, tmp_path / "r", "--gpus", "2")]
    assert cli.main(argv) == 0, capsys.readouterr().err[-3000:]
    assert "rendering 10 of 10 lines on 2 workers" in capsys.readouterr().err
    assert len(list((tmp_path / "r").glob("dialogue_00*.wav"))) == 10
    assert not ray.is_initialized() and sorted(own_ray.left()) == sorted(head)  # its cluster gone, the other running


def test_nothing_left_to_render_starts_no_cluster_and_loads_no_model(design_dir, tmp_path, monkeypatch, capsys):
    from morph.api import MorphTTS

    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    argv = ["render", str(tmp_path / "scene.txt"), *CAST, *options(design_dir, tmp_path / "r")]
    assert cli.main(argv) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").glob("dialogue_00*.wav")}
    capsys.readouterr()

    def refuse(*args, **kwargs):
        raise AssertionError("a rerun with nothing to render started Ray or loaded the model")

    monkeypatch.setattr(MorphTTS, "load", refuse)
    monkeypatch.setattr(ray, "init", refuse)
    for more in ([], ["--gpus", "2"]):
        assert cli.main(argv + more) == 0, capsys.readouterr().err[-3000:]
        out = capsys.readouterr().out
        assert out.startswith("wrote 10 lines (10 reused)"), out
        assert {p.name: p.read_bytes() for p in (tmp_path / "r").glob("dialogue_00*.wav")} == before
        assert (tmp_path / "r" / "dialogue.wav").is_file() and (tmp_path / "r" / "dialogue.srt").is_file()
