"""A render's next group built on a worker thread while the batch runs (morph/group_ahead.py): groups come in take's
order, each built before it is asked for; rows put back after the last group are still taken; a failure in the
build reaches the caller; no worker outlives its render, finished or stopped; and a render's rows get the codes
they get with every group built on the calling thread (tiny model, CPU, mode "lean")."""

from __future__ import annotations

import collections
import threading

import pytest
import torch

from morph import continuous
from morph.group_ahead import GroupAhead
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling
from .helpers import runner_codes

CPU = torch.device("cpu")
WORKER = "morph-prompts"


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(WORKER)]


def source(items: list, width: int, build):
    pending = collections.deque(items)
    take = lambda n: [pending.popleft() for _ in range(min(n, len(pending)))]  # noqa: E731
    return GroupAhead(build, take, width, CPU), pending


def test_groups_come_in_order_each_built_on_the_worker_before_it_is_asked_for():
    built, second_built = [], threading.Event()

    def build(chunk):
        built.append((chunk, threading.current_thread().name))
        if chunk == [3, 4, 5]:
            second_built.set()
        return chunk

    ahead, _ = source(list(range(7)), 3, build)
    try:
        assert ahead.next() == [0, 1, 2]
        assert second_built.wait(10)  # built while the caller had not asked for it yet
        assert ahead.next() == [3, 4, 5] and ahead.next() == [6] and ahead.next() is None
    finally:
        ahead.close()
    assert [c for c, _ in built] == [[0, 1, 2], [3, 4, 5], [6]]
    assert all(name.startswith(WORKER) for _, name in built)
    assert not workers()


def test_rows_put_back_after_the_last_group_are_still_taken():
    ahead, pending = source([0, 1], 2, list)
    try:
        assert ahead.next() == [0, 1] and ahead.next() is None
        pending.appendleft(1)  # a preempted row, back to its source
        assert ahead.next() == [1] and ahead.next() is None
    finally:
        ahead.close()


def test_a_failed_build_reaches_the_caller_and_the_worker_stops():
    def build(chunk):
        raise ValueError(f"no prompt for {chunk}")

    ahead, _ = source([0, 1, 2], 2, build)
    with pytest.raises(ValueError, match=r"no prompt for \[0, 1\]"):
        ahead.next()
    ahead.close()
    assert not workers()


SETTINGS = GenerationSettings(seq_groups=5, do_sample=True, subtalker=Sampling(do_sample=True), seed=3,
                              max_new_tokens=48)
TEXTS = ["one two three four.", "five six.", "seven eight nine ten eleven.", "twelve.", "thirteen fourteen.",
         "fifteen sixteen seventeen.", "eighteen."]


def codes_of(tts, voice, ahead: bool) -> dict:
    lines = [Line(t, voice, "English") for t in TEXTS]
    return runner_codes(tts, SETTINGS, lines, 2, lambda row: row.limit, ahead=ahead)[0]


def test_groups_built_ahead_give_the_rows_their_codes(lean, voices, monkeypatch):
    """Seven rows two at a time: the first group's prompt is built on the calling thread, every later one on the
    worker, and every row's codes are those of the render that built them all on the calling thread."""
    inline = codes_of(lean, voices["icl"], ahead=False)
    threads, talker_inputs = [], continuous.talker_inputs
    monkeypatch.setattr(continuous, "talker_inputs", lambda *args, **kwargs: (
        threads.append(threading.current_thread().name), talker_inputs(*args, **kwargs))[1])
    ahead = codes_of(lean, voices["icl"], ahead=True)
    assert threads[0] == threading.current_thread().name and len(threads) == 4
    assert all(name.startswith(WORKER) for name in threads[1:])
    assert sorted(ahead) == sorted(inline) == list(range(len(TEXTS)))
    assert all(torch.equal(ahead[i], inline[i]) for i in inline)
    assert not workers()


def test_a_render_stopped_midway_leaves_no_worker(lean, voices):
    """A cancel (on_step raising, as ComfyUI's interrupt does) while a later group is built or waiting."""
    calls = []

    def on_step(done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped")

    lines = [Line(t, voices["xvec"], "English") for t in TEXTS]
    with pytest.raises(KeyboardInterrupt):
        BatchTTS(lean).render(lines, SETTINGS, batch_size=2, on_step=on_step)
    assert not workers()
