"""bench/gpu_report.py on the reports the tiny CPU runs write: one JSON keeps every part and how every step
ended (also those that wrote nothing), and the summary shows each measured row."""

import json

from bench import gpu_report

STATUS = {"build": "exit 0 after 31 s", "speed": "exit 0 after 40 s", "batch": "exit 124 after 120 s",
          "faster": "exit 1 after 12 s", "first_call": "exit 0 after 30 s"}  # faster_batch never ran


def test_merge_and_summary(speed_report, batch_report, first_call_report, tmp_path, capsys):
    parts = tmp_path / "parts"
    parts.mkdir()
    stopped = dict(batch_report, complete=False)  # as saved after its first row, before a time limit ended it
    for name, report in (("speed", speed_report), ("batch", stopped), ("first_call", first_call_report)):
        (parts / f"{name}.json").write_text(json.dumps(report))
    for name, ended in STATUS.items():
        (parts / f"{name}.status").write_text(ended + "\n")
    (parts / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n")

    report = gpu_report.main([str(parts), str(tmp_path / "bench_gpu.json")])
    assert json.loads((tmp_path / "bench_gpu.json").read_text()) == report
    assert {k: report[k] for k in gpu_report.HEAD} == {k: speed_report[k] for k in gpu_report.HEAD}
    assert report["gpu"] == "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04" and report["steps"] == STATUS
    assert report["parts"]["speed"] == speed_report and report["parts"]["first_call"] == first_call_report
    assert report["parts"]["faster"] == {"error": "exit 1 after 12 s"}
    assert report["parts"]["faster_batch"] == {"error": "did not run"}

    text = capsys.readouterr().out

    def line(start):
        return next(x.split() for x in text.splitlines() if x.strip().startswith(start))

    upstream, auto, _, _ = speed_report["results"]  # and lean k=5, and the stack that fails
    assert line(f"upstream qwen-tts (xvector, {speed_report['frames']} frames)")[-5:] == \
        [f"{upstream['ms_per_frame']:.2f}", "|", f"{upstream['end_to_end_ms_per_frame']:.2f}",
         f"{upstream['end_to_end_x_real_time']:.1f}x", f"{upstream['end_to_end_peak_memory_gib']:.3f}"]
    assert line("morph auto k=15")[-7:] == \
        [f"{auto['ms_per_frame']:.2f}", "|", f"{auto['end_to_end_ms_per_frame']:.2f}",
         f"{auto['end_to_end_x_real_time']:.1f}x", f"{auto['end_to_end_peak_memory_gib']:.3f}", "ran", "eager"]
    assert line("morph nosuch k=5 (xvector")[6:8] == ["ERROR", "ValueError:"]
    row = batch_report["results"][0]
    assert line("morph auto k=5 batch 2")[-6:] == [f"{row['x_real_time']:.1f}", "|", f"{row['end_to_end_x_real_time']:.1f}",
                                                   f"{row['end_to_end_peak_memory_gib']:.3f}", "ran", "eager"]
    assert line("batch: stopped before the end") and "speed: stopped" not in text
    assert line("auto (cold caches)") and line("auto (warm caches)")
    assert "faster: exit 1 after 12 s" in text and "faster_batch: did not run" in text
    assert "speed exit 0 after 40 s" in text
