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
    assert row["batching"] == "static"  # what eager runs, whatever --batching says
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


def test_mixed_lengths_end_each_row_at_its_own_limit(tiny_dir, tmp_path):
    """--lengths mixed: a script's spread of lengths, each row cut at its own frame, in both timings."""
    from bench import batch
    from bench.common import mixed_texts
    from morph.settings import default_max_frames
    from tests.bench.conftest import _written, fake_clock

    with fake_clock():
        report = _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "3",
                                       "--lengths", "mixed", "--warm-frames", "2", "--batch-sizes", "2",
                                       "--seq-groups", "5"], tmp_path / "mixed.json")
    limits = [default_max_frames(text) for text in mixed_texts(3)]
    row = report["results"][0]
    assert report["lengths"] == "mixed" and report["frames_per_line"] is None and len(set(limits)) > 1
    assert row["frames_per_line"] == [min(limits), max(limits)]
    assert row["audio_s"] == pytest.approx(sum(limits) * 0.08, abs=0.01)
    assert row["end_to_end_audio_s"] == pytest.approx(row["audio_s"], abs=0.01)
    assert row["codec_share_of_end_to_end"] == round(row["codec_decode_s"] / row["end_to_end_wall_s"], 3) > 0


def test_agreement_compares_each_line_in_a_continuous_batch_with_it_alone(tiny_dir, tmp_path):
    """--agreement on CPU in fp32 (mode lean: the continuous batch): each line's own random stream gives it the same
    codes alone as beside the others."""
    from bench import batch
    from tests.bench.conftest import _written

    report = _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "3",
                                   "--frames", "6", "--warm-frames", "2", "--batch-sizes", "3", "--seq-groups", "5",
                                   "--modes", "lean", "--batching", "continuous", "--agreement"],
                      tmp_path / "agreement.json")
    got = report["agreement"]
    assert (got["batch_size"], got["lines"], got["mode"]) == (3, 3, "lean")
    assert got["identical_lines"] == 3 and got["share_of_codes_equal"] == 1.0
    assert got["share_of_frames_before_first_difference"] == {"mean": 1.0, "median": 1.0, "min": 1.0}


def test_script_job_writes_the_same_lines_beside_the_render(batch_report):
    """The script job renders the render's lines into files: one per line, the manifest, the SRT, the dialogue."""
    row = batch_report["results"][0]
    assert row["script_job_wrote"] == dict(line_files=LINES, dialogue=True, srt=True, manifest=True)
    assert row["script_job_audio_s"] == row["end_to_end_audio_s"]
    # its render's one codec call is on the fake clock; smoothing and the files are not (they take none of its time)
    assert row["script_job_runs_s"] == [TICK_S + CODEC_DELAY_S] and row["script_job_wall_s"] == TICK_S + CODEC_DELAY_S


def test_script_job_ends_each_row_where_the_render_does(tiny_dir, tmp_path):
    """--lengths script: rows end at the script's own frames, in the script job's render too."""
    from bench import batch
    from bench.common import script_lines
    from tests.bench.conftest import _written

    report = _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "2",
                                   "--lengths", "script", "--warm-frames", "2", "--batch-sizes", "2", "--seq-groups",
                                   "5"], tmp_path / "script.json")
    row = report["results"][0]
    ends = sum(frames for _, frames in script_lines(2))
    assert row["audio_s"] == row["end_to_end_audio_s"] == row["script_job_audio_s"] == pytest.approx(ends * 0.08)


@pytest.mark.parametrize("first", [False, True])
def test_first_renders_end_to_end_before_any_decode_only_pass(tiny_dir, tmp_path, monkeypatch, first):
    """--first: the configuration's first render (BatchTTS.render) comes before its warm-up and decode-only passes
    (BatchTTS.codes), as a user's first render after loading the model; without it, after them."""
    from bench import batch
    from tests.bench.conftest import _written

    calls = []
    for name in ("render", "codes"):
        real = getattr(batch.BatchTTS, name)
        monkeypatch.setattr(batch.BatchTTS, name, lambda self, *a, _n=name, _r=real, **k: calls.append(_n)
                            or _r(self, *a, **k))
    flags = ["--first"] if first else []
    report = _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "2",
                                   "--frames", "4", "--warm-frames", "2", "--batch-sizes", "2", "--seq-groups", "5",
                                   "--repeats", "2", "--no-script-job", *flags], tmp_path / "first.json")
    assert "error" not in report["results"][0]
    assert calls == (["render"] * 2 + ["codes"] * 3 if first else ["codes"] * 3 + ["render"] * 2)


def test_a_skewed_script_holds_a_minute_long_line_in_every_64_among_short_ones():
    from bench.common import skewed_lines
    from morph.lines.text_split import MAX_SEGMENT_CHARS
    from morph.settings import GenerationSettings

    lines = skewed_lines(130)
    frames = [f for _, f in lines]
    assert [i for i, f in enumerate(frames) if f == 750] == [0, 64, 128]  # a minute at 12.5 frames a second
    assert all(12 <= f <= 63 for i, f in enumerate(frames) if i % 64) and len({t for t, _ in lines}) == 130
    settings = GenerationSettings()
    assert all(len(t) <= MAX_SEGMENT_CHARS and settings.frame_limit(t) >= f for t, f in lines), \
        "one segment each, ending at its own frame before its limit"


def test_static_batching_is_retired():
    """Static batches run only in eager mode now (--modes eager): --batching takes the engine's two ways."""
    from bench import batch

    with pytest.raises(SystemExit):
        batch.main(["--size", "tiny", "--device", "cpu", "--batching", "continuous,static"])


def test_paged_batching_reports_its_pool_and_the_continuous_codes(tiny_dir, tmp_path):
    """--batching continuous,paged: the paged row says its pool and its peak, and speaks what the dense one speaks."""
    from bench import batch
    from tests.bench.conftest import _written

    report = _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "4",
                                   "--lengths", "script", "--warm-frames", "2", "--batch-sizes", "2",
                                   "--seq-groups", "5", "--modes", "lean", "--batching", "continuous,paged",
                                   "--kv-cache-gib", "0.001", "--no-script-job"], tmp_path / "paged.json")
    dense, paged = report["results"]
    assert (dense["batching"], paged["batching"]) == ("continuous", "paged") and "error" not in paged
    assert paged["page"] == 32 and 0 < paged["peak_pages"] <= paged["pages"]
    assert paged["frames_per_line"] == dense["frames_per_line"] and paged["audio_s"] == dense["audio_s"]


def test_warm_up_renders_once_before_the_timed_renders(tiny_dir, tmp_path, monkeypatch, batch_report):
    """--warm-up: one end-to-end render before the timed ones, timed apart (first_render_s), so every timed render is
    warm, as bench/batch_faster.py times its peer after a first batch."""
    from bench import batch
    from morph.render import BatchTTS
    from tests.bench.conftest import _written, fake_clock

    renders = []
    original = BatchTTS.render

    def render(self, *args, **kwargs):
        renders.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BatchTTS, "render", render)
    with fake_clock():
        report = _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "2",
                                       "--frames", "4", "--warm-frames", "2", "--batch-sizes", "2", "--seq-groups", "5",
                                       "--repeats", "2", "--warm-up", "--no-script-job"], tmp_path / "warm.json")
    row = report["results"][0]
    assert len(renders) == 3 and row["end_to_end_runs_s"] == [TICK_S + CODEC_DELAY_S] * 2
    assert row["first_render_s"] == TICK_S + CODEC_DELAY_S
    assert "first_render_s" not in batch_report["results"][0]  # without --warm-up: none
