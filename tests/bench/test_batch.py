"""bench/batch.py's plumbing on the tiny random model, CPU: the fields a report must hold and that its
end-to-end timing (BatchTTS.render) encloses the decode-only one and the codec, on a fake clock
(conftest.fake_clock), so nothing depends on the machine's load. No speed claim."""

import pytest

from tests.bench.conftest import CODEC_DELAY_S, LINE_FRAMES, LINES, TICK_S
from tests.bench.test_speed import check_run_info


def test_report_names_the_run(batch_report):
    check_run_info(batch_report)
    assert batch_report["lines"] == LINES and batch_report["frames_per_line"] == LINE_FRAMES
    assert batch_report["complete"] is True


def test_end_to_end_encloses_decode_only_and_audio_out(batch_report):
    row = batch_report["results"][0]
    assert "error" not in row, row
    assert (row["mode"], row["batch_size"], row["seq_groups"]) == ("auto", 2, 5)
    assert row["ran_as"] == row["end_to_end_ran_as"] == "eager"  # auto is eager on a CPU
    assert row["frames_per_line"] == [LINE_FRAMES, LINE_FRAMES]
    assert row["end_to_end_audio_s"] == pytest.approx(row["audio_s"], abs=0.01) and row["audio_s"] > 0
    for key in ("wall_s", "x_real_time", "peak_memory_gib", "end_to_end_wall_s", "end_to_end_x_real_time",
                "end_to_end_peak_memory_gib"):
        assert row[key] > 0, key
    # one batch, so one codec call of CODEC_DELAY_S on the fake clock: in the end-to-end time, not in decode only
    assert row["wall_s"] == TICK_S and row["codec_decode_s"] == TICK_S + CODEC_DELAY_S
    assert row["end_to_end_wall_s"] == TICK_S + CODEC_DELAY_S


def test_an_unknown_mode_is_an_error_row_naming_the_modes(batch_report):
    row = batch_report["results"][1]
    assert row["mode"] == "nosuch" and "mode must be one of auto, eager" in row["error"]
