"""bench/batch.py's plumbing on the tiny random model, CPU: the fields a report must hold and that its
end-to-end timing (BatchTTS.render) encloses the decode-only one and the codec. No speed claim."""

import json

import pytest

from bench import batch
from tests.bench.conftest import CODEC_DELAY_S
from tests.bench.test_speed import check_run_info

LINES, FRAMES = 2, 4


@pytest.fixture(scope="module")
def report(tiny_dir, tmp_path_factory, slow_codec):
    path = tmp_path_factory.mktemp("batch") / "batch.json"
    out = batch.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", str(LINES),
                      "--frames", str(FRAMES), "--warm-frames", "2", "--batch-sizes", "2", "--seq-groups", "5",
                      "--modes", "auto,nosuch", "--json", str(path)])
    assert json.loads(path.read_text()) == out
    return out


def test_report_names_the_run(report):
    check_run_info(report)
    assert report["lines"] == LINES and report["frames_per_line"] == FRAMES


def test_end_to_end_encloses_decode_only_and_audio_out(report):
    row = report["results"][0]
    assert "error" not in row, row
    assert (row["mode"], row["batch_size"], row["seq_groups"]) == ("auto", 2, 5)
    assert row["ran_as"] == row["end_to_end_ran_as"] == "eager"  # auto is eager on a CPU
    assert row["frames_per_line"] == [FRAMES, FRAMES]
    assert row["end_to_end_audio_s"] == pytest.approx(row["audio_s"], abs=0.01) and row["audio_s"] > 0
    for key in ("wall_s", "x_real_time", "peak_memory_gib", "end_to_end_wall_s", "end_to_end_x_real_time",
                "end_to_end_peak_memory_gib"):
        assert row[key] > 0, key
    # one batch, so one codec call, CODEC_DELAY_S slower here: in the end-to-end time, not in decode only
    assert row["codec_decode_s"] >= CODEC_DELAY_S
    assert row["end_to_end_wall_s"] >= row["wall_s"] + CODEC_DELAY_S / 2


def test_an_unknown_mode_is_an_error_row_naming_the_modes(report):
    row = report["results"][1]
    assert row["mode"] == "nosuch" and "mode must be one of auto, eager" in row["error"]
