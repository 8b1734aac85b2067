"""bench/workload.py's step clock: the frames' pace at each live-row count, read from a render's progress reports."""

import itertools

from bench import workload


def test_the_step_clock_paces_each_live_row_count_by_its_median_gap(monkeypatch):
    # 40 steps of 4 live rows 5 ms apart (one slow step among them), then 40 of one row 2 ms apart, then the
    # render's last report (`total`): the slow step moves no median, and counts seen at fewer steps are left out
    gaps = [0.005] * 39 + [0.050] + [0.002] * 40
    times = itertools.accumulate([0.0] + gaps)
    monkeypatch.setattr(workload.time, "perf_counter", lambda: next(times))
    clock, done = workload.StepClock(), 0
    for live in [4] * 40 + [1] * 40:
        done += live
        clock(done, 1000)
    clock(1000, 1000)
    assert clock.ms_per_frame() == {"1": [40, 2.0], "4": [40, 5.0]}
    assert clock.ms_per_frame(least=41) == {}
