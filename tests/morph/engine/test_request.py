"""morph/engine/request.py in host integers: each row's cache need is its prompt, its frames and the EOS slot; the rows
still to do keep their order; the batch key is the settings without the per-row seed and frame limit, so requests
that differ only there share a batch; a request is itself only (a set of requests never merges two).
(mutmut 3 does not mutate decorated functions, so these properties have no mutants: these tests stand alone.)"""

from __future__ import annotations

import pytest

from morph.engine.request import Request
from morph.lines.line import Row
from morph.settings import GenerationSettings


def request(limits, prompts, settings=None) -> Request:
    rows = [Row(i, 0, f"row {i}", None, f"Test (line {i})", limit) for i, limit in enumerate(limits)]
    return Request(rows, list(range(len(rows))), prompts, settings or GenerationSettings(), lambda r, a: None,
                   lambda e: None)


def test_a_rows_cache_need_is_its_prompt_its_frames_and_the_eos_slot():
    r = request([100, 7], [30, 12])
    assert list(r.needs.values()) == [30 + 100 + 1, 12 + 7 + 1]
    with pytest.raises(ValueError):
        _ = request([100, 7], [30]).needs  # a row without its prompt's length


def test_the_rows_to_do_are_those_whose_audio_is_not_in_in_their_order():
    r = request([5, 5, 5], [10, 10, 10])
    assert r.todo == r.rows and r.status == "waiting"
    r.done.add(r.rows[1])
    assert r.todo == [r.rows[0], r.rows[2]]
    r.done.update(r.rows)
    assert r.todo == []


def test_requests_that_differ_only_in_seed_and_frame_limit_share_a_batch_key():
    a = request([5], [10], GenerationSettings(temperature=0.7, seed=1, max_new_tokens=100))
    b = request([5], [10], GenerationSettings(temperature=0.7, seed=2, max_new_tokens=None))
    c = request([5], [10], GenerationSettings(temperature=0.8, seed=1, max_new_tokens=100))
    d = request([5], [10], GenerationSettings(temperature=0.7, seed=1, max_new_tokens=100, min_new_tokens=6))
    assert a.batch_key == b.batch_key != c.batch_key
    assert d.batch_key != a.batch_key  # the EOS hold is the batch's, one value for all its rows
    assert a.batch_key == GenerationSettings(temperature=0.7) and a.settings.seed == 1  # its own settings are kept


def test_a_request_equals_only_itself():
    a, b = request([5], [10]), request([5], [10])
    assert a != b and len({a, b}) == 2 and a.restart(a.rows)  # by default its rows may run again
