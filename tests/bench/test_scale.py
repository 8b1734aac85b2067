"""bench/scale.py on the CPU: both sides render every line to exactly its own frame limit (EOS held back by the
settings this process and each Ray worker render with), and the report holds what docs/performance.md quotes."""

import json
import os

import pytest
import torch

pytest.importorskip("ray")

from bench import scale  # noqa: E402
from morph.lines.script import parse_script  # noqa: E402
from morph.settings import default_max_frames  # noqa: E402


def test_each_side_renders_every_line_to_its_own_limit(tmp_path, monkeypatch):
    # scale.main sets OMP_NUM_THREADS and torch's threads, as the process of its own it runs in: this one gets its
    # own back after (monkeypatch restores the variable, absent or not)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", ""))
    saved = torch.get_num_threads()
    try:
        report = scale.main(["--size", "tiny", "--device", "cpu", "--dtype", "fp32", "--lines", "6",
                             "--baseline-lines", "3", "--gpus", "2", "--batch-size", "2", "--repeats", "1",
                             "--json", str(tmp_path / "s.json")])
    finally:
        torch.set_num_threads(saved)
    parsed = parse_script(scale.script(6), ["A", "B"])
    seconds = [default_max_frames(p.text) * 0.08 for p in parsed]
    assert len({round(s, 2) for s in seconds}) > 1  # mixed lengths
    run = report["runs"][0]
    assert run["one_gpu"]["audio_s"] == round(sum(seconds[:3]), 1) and run["one_gpu"]["lines"] == 3
    assert run["n_gpus"]["audio_s"] == round(sum(seconds), 1)
    # both sides with the same threads, as each measured them
    assert report["threads"] == 1 and (run["one_gpu"]["torch_threads"], run["one_gpu"]["omp_num_threads"]) == (1, "1")
    assert run["n_gpus"]["workers"] == [dict(device="cpu", torch_threads=1, omp_num_threads="1")] * 2
    assert run["speedup_steady"] > 0 and json.loads((tmp_path / "s.json").read_text())["complete"] is True
    # where the pool's start went, in the order it happens: each worker's process (read from /proc, in another
    # process's clock), its __init__, its model loaded, all after the side began and before the pool was ready
    start = run["n_gpus"]["start_s"]
    for worker in start["workers"]:
        assert 0 <= worker["process"] <= worker["init"] <= worker["loaded"] <= start["pool_ready"] + 0.01
    assert run["one_gpu"]["start_s"]["load"] > 0


def test_same_script_charges_one_gpu_its_start_up_once_and_its_steady_rate_for_all_the_audio():
    one = dict(with_start_s=40.0, steady_s=30.0, audio_s=100.0)
    many = dict(with_start_s=100.0, audio_s=1000.0)
    assert scale.same_script(one, many) == 3.1  # (10 s start-up + 30 s x 10) / 100 s
