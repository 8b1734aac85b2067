"""bench/compare.py on the parts a device call writes: the pack's one line and 32 lines from the tiny model's CPU
reports (tests/bench/conftest.py), the peers' in the fields bench/speed_faster.py and bench/batch_faster.py write
(they need a GPU), the steps' endings and the call's log. Every figure is checked against the runs it comes from."""

import json
import statistics

import pytest

from bench import compare

FASTER = dict(commit="c" * 40, device="NVIDIA H200", torch="2.11.0+cu130", transformers="5.17.0",
              packages={"faster-qwen3-tts": "0.5.4", "qwen-tts-hf": "0.1.1.post1"}, batch=1, frames=250, repeats=2,
              results=[dict(stack="faster-qwen3-tts 0.5.4", prompt="xvector", first_call_s=8.6, frames=250,
                            warmed_up=True, runs_s=[4.8, 5.0], end_to_end_frames=250, end_to_end_first_s=6.1,
                            end_to_end_runs_s=[5.5, 5.9])])
# stopped by its step's time limit in its warm-up, as bench.batch_faster's Phases leaves it on disk
FASTER_BATCH = dict(packages={"faster-qwen3-tts-batch": "0.2.0"}, lines=32, frames_per_line=62, warm_frames=62,
                    repeats=2, phases_s={"wrap": 0.41}, running="warm_up", complete=False, results=[])
STATUS = {"build": "exit 0 after 35 s", "line": "exit 0 after 231 s", "batch": "exit 0 after 29 s",
          "peers": "exit 124 after 125 s"}
STACK = ['Thread 0x00007f2a (most recent call first):',
         '  File "/tmp/compare-peers/faster_qwen3_tts_batch/batched_talker_graph.py", line 171 in capture',
         'Current thread 0x00007f2b (most recent call first):',
         '  File "/tmp/compare-peers/faster_qwen3_tts_batch/model.py", line 112 in warmup']
LOG = "\n".join(["=== build (at most 120 s): python3 -m bench.random_model", "exit 0 after 35 s",
                 "=== peers (at most 125 s): python3 -m bench.batch_faster", "Warming up batched predictor (B=32)",
                 *STACK, "", "exit 124 after 125 s", "  File \"elsewhere.py\", line 1 in not_in_a_step"])


@pytest.fixture
def call(tmp_path, speed_report, batch_report, monkeypatch):
    """OUT and the status folder of a call whose batch peer ran out of time in its warm-up."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    out, status = tmp_path / "out", tmp_path / "status"
    out.mkdir()
    status.mkdir()
    for name, report in (("line", speed_report), ("batch", batch_report), ("faster", FASTER),
                         ("faster_batch", FASTER_BATCH)):
        (out / f"{name}.json").write_text(json.dumps(report))
    (out / "compare.log").write_text(LOG)
    for step, ended in STATUS.items():
        (status / f"{step}.status").write_text(ended + "\n")
    (status / "gpu.txt").write_text("NVIDIA H200, 143771 MiB, 580.95.05\n")
    return out, status


def test_one_line_figures_come_from_each_stacks_runs(call, speed_report):
    report = compare.main([str(call[0]), str(call[1])])
    assert json.loads((call[0] / "compare.json").read_text()) == report
    rows = {row["stack"]: row for row in report["one_line"]}
    assert list(rows) == ["upstream qwen-tts", "morph auto k=15", "morph lean k=5", "faster-qwen3-tts 0.5.4"]
    assert [rows[s]["seq_groups"] for s in rows] == [15, 15, 5, 15]
    faster = rows["faster-qwen3-tts 0.5.4"]
    assert faster["decode_only_ms_per_frame"] == dict(min=19.2, median=19.6, max=20.0, runs=2)
    assert faster["end_to_end_ms_per_frame"] == dict(min=22.0, median=22.8, max=23.6, runs=2)
    assert faster["end_to_end_x_real_time"] == round(80 / 22.8, 2) and faster["timed_runs_warm"] is True
    assert faster["part"] == "faster.json" and faster["first_call_s"] == 8.6
    auto = next(r for r in speed_report["results"] if r["stack"] == "morph auto k=15")
    got = rows["morph auto k=15"]
    per_frame = [1000 * s / auto["frames"] for s in auto["runs_s"]]
    assert got["decode_only_ms_per_frame"]["median"] == pytest.approx(statistics.median(per_frame), abs=1e-3)
    assert got["decode_only_ms_per_frame"]["runs"] == len(auto["runs_s"]) and got["part"] == "line.json"
    assert got["timed_runs_warm"] is False  # the tiny report ran without --warm-up: its first call is a timed run


def test_lines_figures_come_from_each_stacks_runs(call, batch_report):
    report = compare.main([str(call[0]), str(call[1])])
    (row,) = report["lines"]  # the batch peer stopped before any row
    measured = batch_report["results"][0]
    assert row["stack"] == "morph auto k=5" and row["batch_size"] == measured["batch_size"]
    assert row["end_to_end_wall_s"]["median"] == measured["end_to_end_wall_s"]
    assert row["decode_only_x_real_time"]["median"] == round(measured["audio_s"] / measured["runs_s"][0], 1)
    assert row["timed_runs_warm"] is False and row["first_render_s"] is None


def test_the_batch_peers_first_batch_is_its_first_render(call):
    """A peer run that finished: its first batch (of --warm-frames frames) is the untimed first render, and its timed
    runs are warm when that batch was as long as theirs."""
    out, status = call
    row = dict(stack="faster-qwen3-tts-batch 0.2.0", batch_size=32, seq_groups=15, audio_s=158.72, runs_s=[3.1, 3.3],
               end_to_end_audio_s=158.72, end_to_end_runs_s=[4.0, 4.4], warmup_s=25.2)
    finished = dict(FASTER_BATCH, running=None, complete=True, results=[row])
    (out / "faster_batch.json").write_text(json.dumps(finished))
    report = compare.main([str(out), str(status)])
    peer = next(r for r in report["lines"] if r["stack"].startswith("faster"))
    assert peer["first_render_s"] == 25.2 and peer["timed_runs_warm"] is True
    assert peer["decode_only_x_real_time"] == dict(min=48.1, median=49.6, max=51.2, runs=2)
    assert peer["end_to_end_wall_s"] == dict(min=4.0, median=4.2, max=4.4, runs=2)
    assert "faster_batch" not in report["not_finished"]
    (out / "faster_batch.json").write_text(json.dumps(dict(finished, warm_frames=8)))
    assert compare.main([str(out), str(status)])["lines"][-1]["timed_runs_warm"] is False


def test_what_did_not_finish_says_where_it_was(call):
    report = compare.main([str(call[0]), str(call[1])])
    stopped = report["not_finished"]
    assert stopped["faster_batch"] == dict(step="exit 124 after 125 s", running="warm_up", phases_s={"wrap": 0.41},
                                           stacks=STACK)
    assert "mode must be one of" in stopped["line: morph nosuch k=5"]
    assert "mode must be one of" in stopped["batch: morph nosuch k=5"]
    assert set(stopped) == {"faster_batch", "line: morph nosuch k=5", "batch: morph nosuch k=5"}


def test_the_run_is_named_once(call, speed_report, capsys):
    report = compare.main([str(call[0]), str(call[1])])
    assert {k: report[k] for k in compare.HEAD} == {k: speed_report[k] for k in compare.HEAD}
    assert report["gpu"] == "NVIDIA H200, 143771 MiB, 580.95.05" and report["allocator"] == "native"
    assert report["steps"] == STATUS
    assert report["packages"]["faster-qwen3-tts"] == "0.5.4" and report["packages"]["faster-qwen3-tts-batch"] == "0.2.0"
    text = capsys.readouterr().out
    assert "faster-qwen3-tts 0.5.4" in text and "19.600 [19.2-20.0]" in text and "not finished: faster_batch" in text


def test_a_part_never_written_is_named_with_its_steps_ending(call):
    out, status = call
    (out / "faster.json").unlink()
    (out / "faster_batch.json").unlink()
    (status / "peers.status").write_text("exit 1 after 12 s\n")
    (out / "compare.log").unlink()  # a call that lost its log still gets its report
    report = compare.main([str(out), str(status)])
    assert report["not_finished"]["faster"] == dict(step="exit 1 after 12 s", report="none written", stacks=[])
    assert report["not_finished"]["faster_batch"]["report"] == "none written"
    assert [row["stack"] for row in report["one_line"]][-1] == "morph lean k=5"


def test_the_folders_must_exist(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        compare.main([str(tmp_path / "nowhere"), str(tmp_path)])
    assert stop.value.code == 2 and "nowhere is not a folder" in capsys.readouterr().err
