"""A script over Ray workers, on a real local Ray cluster with the tiny model on the CPU: the files of one process,
a killed worker's lines rendered again and none twice, resume, and bad input refused before any rendering."""

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

ray = pytest.importorskip("ray")

import cli  # noqa: E402
from morph.distributed.job import WorkerPool, plan  # noqa: E402
from morph.lines.script import parse_script  # noqa: E402
from morph.lines.store import LineStore  # noqa: E402
from morph.render import Line  # noqa: E402
from morph.script_job import ScriptJob  # noqa: E402
from morph.settings import GenerationSettings, Sampling  # noqa: E402

WORDS = ["Hello there.", "Hi!", "How are you today, my friend?", "Fine.", "The weather is lovely this morning.",
         "Yes.", "Shall we go for a walk along the river?", "Why not.", "Let us take the long way round.", "Good."]
SCRIPT = "".join(f"{'Alice' if i % 2 else 'Bob'}: {text}\n" for i, text in enumerate(WORDS))


def options(model, out, *more):
    return ["--model", str(model), "--device", "cpu", "--greedy", "--max-new-tokens", "6", "--out", str(out), *more]


def files(folder):
    """{name: samples (a WAV: its header holds a time stamp) or text} of the line files, dialogue and subtitles."""
    return {p.name: sf.read(p, dtype="float32")[0] if p.suffix == ".wav" else p.read_text()
            for p in sorted(folder.iterdir()) if p.suffix in (".wav", ".srt")}


@pytest.fixture(scope="module")
def design_dir(model_dirs):
    return model_dirs("tiny", "voice_design")


def test_two_workers_write_the_files_of_one_process(design_dir, tmp_path, capsys):
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    cast = ["--design", "Alice=A warm voice.", "--design", "Bob=A bright voice."]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a Ray worker with one CPU runs: the CPU's reductions then add up alike
    try:
        for out, more in (("one", []), ("ray", ["--gpus", "2"])):
            argv = ["render", str(tmp_path / "scene.txt"), *options(design_dir, tmp_path / out, *cast,
                                                                     "--batch-size", "3")]
            assert cli.main(argv + more) == 0
            err = capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
    assert "rendering 10 of 10 lines on 2 workers, 3 at a time" in err, err
    one, two = files(tmp_path / "one"), files(tmp_path / "ray")
    assert list(one) == list(two) and len(one) == 12  # 10 lines, the dialogue, the subtitles
    assert [name for name in one if not np.array_equal(one[name], two[name])] == []  # bit for bit
    manifest = [json.loads((tmp_path / f / "dialogue_lines.json").read_text()) for f in ("one", "ray")]
    assert manifest[0] == manifest[1]
    assert not ray.is_initialized()  # the local cluster went with the job


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a Ray worker with one CPU runs
    yield
    torch.set_num_threads(threads)


def back(pool, actor, seconds=60):
    """The worker's about() once Ray has it running again."""
    for _ in range(seconds * 2):
        try:
            return pool.ray.get(actor.about.remote())
        except ray.exceptions.ActorUnavailableError:
            time.sleep(0.5)
    raise AssertionError(f"the worker did not come back within {seconds} s")


def script_job(folder, parsed, context):
    lines = [Line(p.text, instruct=f"{p.name}'s voice.") for p in parsed]
    store = LineStore(folder, "s", "test")
    store.__enter__()  # held while the test runs: each test has a folder of its own
    return ScriptJob(parsed, lines, store, context)


def test_a_killed_worker_loses_no_line_and_writes_none_twice(design_dir, tmp_path, caplog, one_thread):
    settings = GenerationSettings(do_sample=False, subtalker=Sampling(do_sample=False), max_new_tokens=30)
    parsed = parse_script(SCRIPT, ["Alice", "Bob"])
    load = dict(source=str(design_dir), device="cpu", dtype="fp32", attention="sdpa")
    with WorkerPool(2, load, who="test") as pool:
        job = script_job(tmp_path / "ray", parsed, pool.context("Auto", settings, False))
        victim = pool.about[1]["pid"]
        seen = []

        def kill_once(rendered):  # the first batch back: the other worker is still rendering its own
            seen.extend(i for i, _ in rendered)
            if victim is not None and len(seen) == 1:
                os.kill(victim, signal.SIGKILL)

        pool.render(job, settings, batch_size=1, pause_seconds=0.1, on_lines=kill_once)
        assert back(pool, pool.actors[1])["pid"] != victim  # Ray started it again
    assert "a worker was lost" in caplog.text
    assert sorted(seen) == list(range(10))  # every line once in the manifest's count ...
    manifest = json.loads((tmp_path / "ray" / "s_lines.json").read_text())["lines"]
    assert sorted(manifest) == [f"{i:04d}" for i in range(1, 11)]
    assert len(list((tmp_path / "ray").glob("s_*.wav"))) == 10 and not list((tmp_path / "ray").glob("*.part"))

    from morph.api import MorphTTS

    tts = MorphTTS.load(**load)  # ... and each file what one process renders
    alone = script_job(tmp_path / "one", parsed, {}).run(lambda todo: tts, settings, 1, 0.1).clips
    for i, p in enumerate(parsed):
        np.testing.assert_array_equal(sf.read(tmp_path / "ray" / f"s_{i + 1:04d}_{p.name}.wav", dtype="float32")[0],
                                      alone[i])


def test_batches_are_planned_longest_first_as_one_gpu_would():
    lines = [Line("a" * n) for n in (10, 300, 40, 300, 5)]
    assert plan(range(5), lines, GenerationSettings(), 2) == [[1, 3], [2, 0], [4]]
    assert plan([0, 2, 4], lines, GenerationSettings(max_new_tokens=8), 2) == [[2, 0], [4]]  # then by text


def test_ctrl_c_stops_the_cluster_and_the_same_command_renders_the_rest(design_dir, tmp_path, capsys, monkeypatch,
                                                                            own_ray, caplog):
    import cli_render

    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    argv = ["render", str(tmp_path / "scene.txt"), *options(design_dir, tmp_path / "r", "--design", "Alice=Warm.",
                                                            "--design", "Bob=Bright.", "--batch-size", "2",
                                                            "--gpus", "2")]
    lines_done = cli_render.ScriptProgress.lines_done

    def interrupt_after_the_first(self, rendered):
        lines_done(self, rendered)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_render.ScriptProgress, "lines_done", interrupt_after_the_first)
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("interrupted: 2 of 10 lines are in ")
    assert not ray.is_initialized() and own_ray.left() == []  # the cluster it started, whole
    monkeypatch.undo()
    caplog.set_level(logging.INFO)
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "rendering 8 of 10 lines on 2 workers" in err
    assert (err + caplog.text).count("2 of 10 lines already rendered in") == 1  # said once, by the job
    assert len(list((tmp_path / "r").glob("dialogue_00*.wav"))) == 10 and (tmp_path / "r" / "dialogue.wav").is_file()


def test_bad_input_is_refused_before_any_rendering(model_dirs, tmp_path, capsys, monkeypatch):
    (tmp_path / "scene.txt").write_text("Alice: Hi.\nBob: Hello.\n", encoding="utf-8")
    base = ["render", str(tmp_path / "scene.txt"), "--device", "cpu", "--out", str(tmp_path / "r"), "--gpus", "2"]
    custom = ["--model", str(model_dirs("tiny", "custom_voice")), "--speaker", "Alice=Vivian"]
    assert cli.main(base + custom + ["--speaker", "Bob=Nobody"]) == 2
    assert "(script line 2, Bob): unknown speaker 'Nobody'" in capsys.readouterr().err
    assert not list((tmp_path / "r").glob("*.wav"))

    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed: said before the model loads
    assert cli.main(base + custom + ["--speaker", "Bob=Ryan"]) == 2
    err = capsys.readouterr().err
    assert "error: --gpus needs Ray, which is not installed here: pip install 'ray>=2.40'" in err and "loading" not in err


def test_a_terminated_job_stops_its_cluster_and_keeps_its_lines(design_dir, tmp_path, own_ray):
    """`kill PID` (SIGTERM) ends `cli.py render --gpus` as Ctrl-C does, in a process of its own."""
    import subprocess

    (tmp_path / "long.txt").write_text("".join(f"A: {'word ' * (3 + i % 20)}\n" for i in range(200)), encoding="utf-8")
    command = [sys.executable, "cli.py", "render", str(tmp_path / "long.txt"), "--design", "A=Warm.",
               *options(design_dir, tmp_path / "r", "--batch-size", "2", "--gpus", "2")]
    job = subprocess.Popen(command, cwd=Path(cli.__file__).parent, stderr=subprocess.PIPE, text=True)
    for line in job.stderr:
        if "of 200 lines |" in line:  # a progress line: some lines are done
            break
    job.terminate()
    err = job.stderr.read()
    assert job.wait(60) == 130, err
    assert "interrupted: " in err and "the same command renders the rest" in err
    kept = json.loads((tmp_path / "r" / "dialogue_lines.json").read_text())["lines"]
    assert 0 < len(kept) < 200 and all((tmp_path / "r" / line["file"]).is_file() for line in kept.values())
    # (a batch in flight may have left its files too; without a manifest entry, a rerun renders them again)
    assert own_ray.left() == []  # every process of the cluster it started


def test_a_worker_that_cannot_load_the_model_says_so(tmp_path):
    with pytest.raises(RuntimeError, match=r"^test: a worker could not load the model: .*model.*; on a cluster"):
        WorkerPool(1, dict(source=str(tmp_path / "no-model"), device="cpu"), who="test")
    assert not ray.is_initialized()


def test_an_output_folder_the_workers_do_not_share_is_refused_at_the_first_batch(design_dir, tmp_path):
    import tests
    from tests.morph.distributed.elsewhere import ElsewherePool

    settings = GenerationSettings(do_sample=False, subtalker=Sampling(do_sample=False), max_new_tokens=4)
    parsed = parse_script(SCRIPT, ["Alice", "Bob"])
    load = dict(source=str(design_dir), device="cpu", dtype="fp32", attention="sdpa")
    with ElsewherePool(1, load, who="test", packages=[tests]) as pool:
        job = script_job(tmp_path / "out", parsed, pool.context("Auto", settings, False))
        with pytest.raises(RuntimeError, match=r"^test: the worker on .+ wrote s_00\d\d_\w+\.wav where this machine does "
                                               r"not see it: --out must be a folder every machine of the cluster shares"):
            pool.render(job, settings, batch_size=5, pause_seconds=0.1)
    assert not (tmp_path / "out" / "s_lines.json").exists()  # nothing recorded as done


def test_address_joins_a_running_cluster_and_leaves_it_running(design_dir, tmp_path, own_ray):
    """`--address`: the multi-machine way (`ray start --head`, then the job joins it), here with one machine, with
    Ray's token authentication on as docs/scripts.md runs it: a token in the (test's own) ~/.ray, RAY_AUTH_MODE=token
    set before Ray is imported (so the job runs in a process of its own)."""
    import subprocess

    env = dict(os.environ, HOME=str(tmp_path / "home"))
    address = own_ray.head(tmp_path / "head", env)  # the token in the test's ~/.ray, RAY_AUTH_MODE=token in env
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    command = [sys.executable, "cli.py", "render", str(tmp_path / "scene.txt"), "--design", "Alice=Warm.",
               "--design", "Bob=Bright.", *options(design_dir, tmp_path / "r", "--batch-size", "4", "--address",
                                                   address)]
    job = subprocess.run(command, cwd=Path(cli.__file__).parent, capture_output=True, text=True, env=env, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "rendering 10 of 10 lines on 2 workers" in job.stderr  # every CPU of the cluster
    assert len(list((tmp_path / "r").glob("dialogue_00*.wav"))) == 10
    status = subprocess.run([str(Path(sys.executable).parent / "ray"), "status", "--address", address], capture_output=True, text=True, env=env)
    assert status.returncode == 0, status.stderr[-2000:]  # the job let go of the cluster and left it running
