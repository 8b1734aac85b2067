"""bench/stream_profile.py: each stream's kernels summed and its busy time with overlaps counted once (a trace's
events as torch's profiler writes them), and a render profiled end to end on the tiny model on the CPU."""

from bench import stream_profile


def _kernel(stream, name, ts, dur, cat="kernel"):
    return dict(cat=cat, name=name, ts=ts, dur=dur, args=dict(stream=stream))


def test_streams_are_summed_and_their_overlaps_counted_once():
    events = [_kernel(7, "step", 0, 10), _kernel(7, "step", 5, 10), _kernel(7, "norm", 30, 5),
              _kernel(21, "conv", 12, 20), _kernel(21, "Memcpy DtoD", 40, 2, cat="gpu_memcpy"),
              dict(cat="cpu_op", name="aten::add", ts=0, dur=100)]  # host events are not the GPU's
    table = stream_profile.stream_table(events, top=1)
    assert table["streams"]["7"] == dict(kernels=3, sum_ms=0.0, busy_ms=0.0, top=[["step", 0.0, 2]])
    assert table["streams"]["21"]["kernels"] == 2 and table["streams"]["21"]["top"] == [["conv", 0.0, 1]]
    # in microseconds: stream 7 busy 0-15 and 30-35, stream 21 12-32 and 40-42, all of them 0-35 and 40-42
    assert stream_profile.busy_us([(0, 10), (5, 15), (30, 35)]) == 20
    assert stream_profile.busy_us([(e["ts"], e["ts"] + e["dur"]) for e in events[:5]]) == 37
    assert stream_profile.busy_us([]) == 0


def test_a_render_is_profiled_after_two_warm_ones(tiny_dir, tmp_path):
    report = stream_profile.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--lines", "3",
                                  "--frames", "6", "--batch-size", "2", "--mode", "lean",
                                  "--json", str(tmp_path / "p.json")])
    assert len(report["walls_s"]) == 2 and report["profiled_wall_s"] > 0 and report["batching"] == "continuous"
    assert report["streams"] == {} and report["busy_ms"] == 0  # no GPU here: the CPU's ops are not counted
    assert (tmp_path / "p.json").exists()
