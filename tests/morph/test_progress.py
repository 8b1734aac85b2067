"""morph/progress.py: when a plain progress report is due, and what it says."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import morph.progress as progress


@pytest.fixture
def clock(monkeypatch):
    """The module's clock, moved by hand: now[0] seconds."""
    now = [100.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_a_report_is_due_first_then_every_few_seconds(clock):
    cadence = progress.Cadence(every=5.0, gap=1.0)
    due = []
    for tick in range(0, 121):  # 12 s in tenths
        clock[0] = 100.0 + tick / 10
        if cadence.due():
            due.append(round(clock[0] - 100.0, 1))
    assert due == [0.0, 5.0, 10.0]


def test_a_batch_of_lines_is_reported_at_once_but_not_more_often_than_the_gap(clock):
    cadence = progress.Cadence(every=5.0, gap=1.0)
    assert cadence.due()
    clock[0] += 0.5
    cadence.mark()
    assert not cadence.due(), "within the gap"
    clock[0] += 0.5
    assert cadence.due(), "the marked batch, once the gap has passed"
    clock[0] += 1.5
    assert not cadence.due(), "no batch since: the steady cadence only"
    cadence.mark()
    assert cadence.due()


def test_the_summary_counts_lines_audio_speed_and_time_left(clock):
    job = progress.JobProgress(lines=4)
    assert job.summary() == "0 of 4 lines | 0.0 s of audio | 0.0x real time | estimating"
    clock[0] += 2.0
    job.step(50, 100)
    job.lines_done([24000 * 3, 24000 * 5])
    assert job.summary() == "2 of 4 lines | 8.0 s of audio | 4.0x real time | about 0:02 left"
    clock[0] += 2.0
    job.lines_done([24000 * 2, 24000 * 6])
    assert job.summary(final=True) == "4 of 4 lines | 16.0 s of audio | 4.0x real time | took 0:04"



def test_frame_slots_never_go_backwards_and_never_past_the_total():
    """Batches report their own slot counts as they go; a later, smaller one never takes the bar back."""
    seen = []
    slots = progress.SlotProgress(lambda done, total: seen.append((done, total)), total=100)
    for value in (5, 3, 7, 7, 250, 40):
        slots.report(value)
    slots.finish()
    assert seen == [(5, 100), (5, 100), (7, 100), (7, 100), (100, 100), (100, 100)]


def test_a_render_reports_from_zero_and_its_finish_fills_the_slots_eos_left_unused():
    seen = []
    slots = progress.SlotProgress(lambda done, total: seen.append((done, total)), total=1)
    slots.report(0)
    slots.finish()
    empty = progress.SlotProgress(lambda done, total: seen.append((done, total)), total=0)  # nothing to decode
    empty.finish()
    assert seen == [(0, 1), (1, 1), (1, 1)]


def test_a_clock_reads_minutes_and_seconds():
    assert [progress.clock(s) for s in (0, 59.4, 59.6, 125, 3600)] == ["0:00", "0:59", "1:00", "2:05", "60:00"]


def test_the_time_left_waits_for_two_percent_and_a_short_elapsed_time_still_gives_the_speed(clock):
    job = progress.JobProgress(lines=1)
    clock[0] += 0.5
    job.lines_done([24000 * 4])
    job.step(2, 100)
    assert job.summary() == "1 of 1 lines | 4.0 s of audio | 8.0x real time | estimating"
    job.step(1, 1)
    assert job.fraction == 1.0 and job.summary().endswith("about 0:00 left")
