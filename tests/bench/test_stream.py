"""bench/stream.py on the tiny random model, CPU, mode lean (the continuous batch streams there): both ways speak
every line to its own frame, the stream hands its first audio before its line is done and in a few frames' chunk,
clone's first audio is its whole line, and the summary is over the lines after the first call. No speed claim."""

import pytest

from bench.common import script_lines
from tests.bench.conftest import _written

LINES = 3


@pytest.fixture(scope="module")
def report(tiny_dir, tmp_path_factory):
    from bench import stream

    return _written(stream.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines",
                                  str(LINES), "--mode", "lean"], tmp_path_factory.mktemp("stream") / "stream.json")


def test_each_line_is_spoken_both_ways_to_its_own_frame(report):
    frames = [f for _, f in script_lines(LINES)]
    for way in ("stream", "clone"):
        runs = report["runs"][way]
        assert [r["frames"] for r in runs] == frames and all(r["ran_as"] == "lean" for r in runs)
        assert [r["audio_s"] for r in runs] == pytest.approx([f * 0.08 for f in frames], abs=1e-3)
    assert report["complete"] is True and report["mode"] == "lean"


def test_the_stream_hands_audio_before_its_line_is_done_and_clone_only_when_it_is(report):
    for r in report["runs"]["stream"]:
        assert r["chunks"] > 1 and r["first_chunk_audio_s"] < r["audio_s"] and r["first_audio_s"] <= r["wall_s"]
        assert r["first_chunk_audio_s"] <= 4 * 0.08 + 1e-3  # FIRST_GRID frames on the CPU
    assert all(r["first_audio_s"] == r["wall_s"] for r in report["runs"]["clone"])


def test_the_summary_leaves_the_first_call_apart(report):
    for way in ("stream", "clone"):
        s, runs = report[way], report["runs"][way]
        assert s["first_call"] == runs[0] and s["lines"] == LINES - 1
        assert s["first_audio_p50_s"] <= s["first_audio_p95_s"] <= s["first_audio_max_s"]
        assert s["first_audio_max_s"] == max(r["first_audio_s"] for r in runs[1:])
        # the summary rounds to two decimals: on a loaded CPU the figure is small enough for that to pass 1%
        assert s["x_real_time"] == pytest.approx(sum(r["audio_s"] for r in runs[1:]) / sum(r["wall_s"] for r in runs[1:]),
                                                 rel=1e-2, abs=0.005)
    assert report["stream"]["first_chunk_audio_p50_s"] > 0


def test_frames_holds_every_line_to_that_many_frames(tiny_dir, tmp_path):
    """--frames 1: a warm clone of one frame, each line's own text (issue 35's floor of first audio)."""
    from bench import stream

    report = _written(stream.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "2",
                                    "--mode", "lean", "--frames", "1"], tmp_path / "clone1.json")
    assert report["held_frames"] == 1
    for way in ("stream", "clone"):
        assert [r["frames"] for r in report["runs"][way]] == [1, 1]
        assert [r["audio_s"] for r in report["runs"][way]] == pytest.approx([0.08, 0.08], abs=1e-3)


def test_parts_times_the_engines_parts_on_the_host_and_puts_them_back(tiny_dir, tmp_path):
    """--parts: every part of bench.stream.PARTS in ms a line, the render holding the rest; on the CPU in mode lean
    the weights' fingerprint is not taken (only the fast modes bind graphs) and every other part runs; after the run
    no part is left wrapped."""
    import importlib

    from bench import stream

    report = _written(stream.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "3",
                                    "--mode", "lean", "--frames", "2", "--parts"], tmp_path / "parts.json")
    parts = report["host_parts_ms_a_line"]
    assert list(parts) == [name for _, name in stream.PARTS]
    assert parts["TalkerLoop.owner"] == 0
    assert all(ms > 0 for name, ms in parts.items() if name != "TalkerLoop.owner"), parts
    assert all(parts["BatchTTS.render"] >= ms for ms in parts.values())
    for module, name in stream.PARTS:
        owner, attr = name.split(".")
        assert not hasattr(getattr(getattr(importlib.import_module(module), owner), attr), "__wrapped__")
