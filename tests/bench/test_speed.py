"""bench/speed.py's plumbing on the tiny random model, CPU: the fields a report must hold and what its
end-to-end timings enclose, on a fake clock (conftest.fake_clock), so nothing depends on the machine's load.
Random weights on a shared CPU: no speed claim."""

import re

import pytest

from bench import speed
from tests.bench.conftest import CODEC_DELAY_S, FIRST_CALL_FRAMES, FRAMES, REPEATS, TICK_S


def check_run_info(report):
    assert re.fullmatch(r"[0-9a-f]{40}", report["commit"]) and isinstance(report["uncommitted_changes"], list)
    assert report["device"].startswith("CPU") and report["torch"] and report["transformers"]


def test_report_names_the_run(speed_report):
    check_run_info(speed_report)
    assert speed_report["batch"] == 1 and speed_report["frames"] == FRAMES and speed_report["complete"] is True


def test_end_to_end_encloses_decode_only_and_audio_out(speed_report):
    upstream, auto, lean = speed_report["results"][:3]
    assert [r["stack"] for r in (upstream, auto, lean)] == ["upstream qwen-tts", "morph auto k=15", "morph lean k=5"]
    for row, codec in ((upstream, CODEC_DELAY_S), (auto, CODEC_DELAY_S), (lean, 0.0)):
        assert "error" not in row, row
        assert row["frames"] == row["end_to_end_frames"] == FRAMES
        for key in ("ms_per_frame", "x_real_time", "peak_memory_gib", "end_to_end_ms_per_frame",
                    "end_to_end_x_real_time", "end_to_end_peak_memory_gib"):
            assert row[key] > 0, key
        # upstream's codec (CODEC_DELAY_S on the fake clock) is in every end-to-end run of the stacks that run it
        # (upstream, and eager: what auto is on a CPU), and in no decode-only run; lean decodes with the lean codec
        assert row["runs_s"] == [TICK_S] * REPEATS
        assert row["end_to_end_runs_s"] == [TICK_S + codec] * REPEATS
        assert row["end_to_end_ms_per_frame"] == pytest.approx(1000 * (TICK_S + codec) / FRAMES, abs=1e-3)
        assert row["ms_per_frame"] == pytest.approx(1000 * TICK_S / FRAMES, abs=1e-3)


def test_each_stack_times_the_codec_it_runs(speed_report):
    upstream, auto, lean = speed_report["results"][:3]
    assert upstream["codec"] == "upstream speech tokenizer"
    assert auto["codec"] == "upstream decoder in pieces (morph/codec/pieces.py)"  # eager on a CPU
    assert lean["codec"] == "lean codec (morph/codec)"
    for row, delay in ((upstream, CODEC_DELAY_S), (auto, CODEC_DELAY_S), (lean, 0.0)):
        assert row["codec_decode_ms_per_frame"] == pytest.approx(1000 * (TICK_S + delay) / FRAMES, abs=1e-3)


def test_median_spread_and_first_call_of_each_column(speed_report):
    """Every column is the median of REPEATS runs with their min and max; end to end includes the stack's first
    call (the first run), which is also reported alone."""
    assert speed_report["repeats"] == REPEATS
    for row in speed_report["results"][:3]:
        assert len(row["runs_s"]) == len(row["end_to_end_runs_s"]) == REPEATS
        assert row["first_call_s"] == row["end_to_end_runs_s"][0]
        for key in ("ms_per_frame", "end_to_end_ms_per_frame", "codec_decode_ms_per_frame"):
            low, high = row[f"{key}_spread"]
            assert low <= row[key] <= high, key
        assert row["end_to_end_warm_ms_per_frame"] == row["end_to_end_ms_per_frame"]  # the fake clock: all alike


def record_runner_calls(stacks, monkeypatch) -> list[str]:
    """The names of the stack runner's calls (speak: end to end, generate: decode only), in order, as they come."""
    calls = []

    def recorded(name, method):
        def run(self, *args, **kwargs):
            calls.append(name)
            return method(self, *args, **kwargs)
        return run

    for name in ("speak", "generate"):
        monkeypatch.setattr(stacks.Runner, name, recorded(name, getattr(stacks.Runner, name)))
    return calls


def test_end_to_end_and_decode_only_are_taken_in_turn(tiny_dir, tmp_path, monkeypatch):
    """Same warm state for both columns: E D E D E D, the stack's first call end to end."""
    from bench import stacks

    calls = record_runner_calls(stacks, monkeypatch)
    speed.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--frames", "3", "--repeats", "3",
                "--prompts", "xvector", "--stacks", "auto:5", "--agreement", "", "--json", str(tmp_path / "s.json")])
    assert calls == ["speak", "generate"] * 3


def test_rows_record_the_mode_actually_run(speed_report):
    """Both columns of a fast mode run the engine: the patched model's generate alone runs the HF layers."""
    upstream, auto, lean = speed_report["results"][:3]
    assert "ran_as" not in upstream
    assert auto["ran_as"] == auto["end_to_end_ran_as"] == "eager"  # auto is eager on a CPU
    assert lean["ran_as"] == lean["end_to_end_ran_as"] == "lean"


def test_an_unknown_mode_is_an_error_row_naming_the_modes(speed_report):
    row = speed_report["results"][3]
    assert row["stack"] == "morph nosuch k=5" and "mode must be one of auto, eager" in row["error"]
    assert "ms_per_frame" not in row


def test_default_stacks_follow_the_engine_modes():
    from morph.decode.runner import MODES

    assert speed.DEFAULT_STACKS.split(",") == ["upstream"] + [f"{m}:{k}" for m in MODES for k in (15, 5)]


def test_first_call_runs_cold_then_warm_in_fresh_processes(first_call_report):
    check_run_info(first_call_report)
    cold, warm = first_call_report["first_call"]
    assert (cold["caches"], warm["caches"]) == ("cold", "warm")
    for row in (cold, warm):
        assert "error" not in row, row
        assert row["mode"] == "auto" and row["ran_as"] == "eager" and row["frames"] == FIRST_CALL_FRAMES
        assert row["seq_groups"] == first_call_report["seq_groups"] == 5
        # real clocks in two processes: each is recorded, and none is compared (that would depend on the load)
        for key in ("since_spawn_s", "load_s", "voice_s", "first_generation_s", "process_s"):
            assert isinstance(row[key], float) and row[key] >= 0, key
    assert cold["cache_files_at_start"] == 0


def test_warm_up_makes_a_morph_stacks_first_call_apart(tiny_dir, tmp_path, monkeypatch):
    """--warm-up: a morph stack's first call before its timed runs (W E D E D), so every timed run is warm, as the
    peers' benches time theirs; upstream, with nothing to capture, is not warmed (E D E D)."""
    from bench import stacks
    from tests.bench.conftest import fake_clock

    calls = record_runner_calls(stacks, monkeypatch)
    with fake_clock():
        report = speed.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--frames", "3",
                             "--repeats", "2", "--prompts", "xvector", "--stacks", "auto:5,upstream", "--warm-up",
                             "--agreement", "", "--json", str(tmp_path / "s.json")])
    assert calls == ["speak"] + ["speak", "generate"] * 2 + ["speak", "generate"] * 2
    auto, upstream = report["results"]
    assert auto["warmed_up"] is True and upstream["warmed_up"] is False
    assert "first call apart" in report["order"]
    for row in (auto, upstream):
        assert len(row["runs_s"]) == len(row["end_to_end_runs_s"]) == 2
    # the warm-up's own reading on the fake clock: its codec's delay in it, and in no timed run's count
    assert auto["first_call_s"] == pytest.approx(TICK_S + CODEC_DELAY_S)
    assert auto["end_to_end_warm_ms_per_frame"] == auto["end_to_end_ms_per_frame"]
    assert upstream["first_call_s"] == upstream["end_to_end_runs_s"][0]
    assert auto["end_to_end_ran_as"] == "eager" and "capture_or_compile_s" in auto
