"""bench/ready.py's plumbing on the tiny random model, CPU: each render's wall, audio and the graphs it captured, and
what ready() was asked for. On the CPU nothing is captured and ready() has nothing to do (no speed claim)."""

import json

from bench import ready


def test_two_renders_are_reported_with_their_captures_and_ready_as_asked(tiny_dir, tmp_path, monkeypatch):
    from morph.api import MorphTTS

    asked = []
    real = MorphTTS.ready
    monkeypatch.setattr(MorphTTS, "ready", lambda self, width=64, who="": asked.append(width) or real(self, width))
    out = tmp_path / "ready.json"
    report = ready.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "2",
                         "--frames", "4", "--width", "2", "--ready-width", "4", "--json", str(out)])
    assert json.loads(out.read_text()) == report and asked == [4]
    assert report["ready_width"] == 4 and report["ready_s"] is None and report["held_gib"] == 0
    assert [r["captures"] for r in report["renders"]] == [0, 0]
    assert all(r["audio_s"] > 0 and r["wall_s"] > 0 for r in report["renders"])
    assert report["first_over_second"] == round(report["renders"][0]["wall_s"] / report["renders"][1]["wall_s"], 3)
    skipped = ready.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "1",
                          "--frames", "2", "--width", "1", "--renders", "1", "--no-ready"])
    assert "ready_s" not in skipped and skipped["first_over_second"] is None and asked == [4]


def test_a_profiled_pair_of_renders_names_the_functions_whose_own_time_grew_most(tiny_dir):
    report = ready.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "2",
                         "--frames", "4", "--width", "2", "--no-ready", "--profile", "3"])
    grown = [f["own_s"][0] - f["own_s"][1] for f in report["slower_first"]]
    assert len(grown) == 3 and all(a >= b - 2e-4 for a, b in zip(grown, grown[1:])), report["slower_first"]  # rounded
    assert all(len(f["calls"]) == 2 and ":" in f["function"] for f in report["slower_first"])
