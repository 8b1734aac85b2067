"""A group's rows prefilled a slice at a time (morph/decode/groups.py; tiny model, CPU, fp32, mode "lean"): no
prefill holds more than PREFILL_TOKENS tokens of prompt (a row at least), each row is prefilled once, and every row's
codes are those a prefill of its whole group gives."""

from __future__ import annotations

import pytest
import torch

import morph.decode.prefill_graphs as prefill_graphs
import morph.settings as settings
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling

SETTINGS = GenerationSettings(seq_groups=5, do_sample=True, subtalker=Sampling(do_sample=True), max_new_tokens=12,
                              seed=5)


@pytest.fixture
def prefills(monkeypatch):
    """The (rows, tokens) of every prefill the batch runs."""
    calls = []
    real = prefill_graphs.lean_prefill

    def spy(embeds, mask, *rest, **named):
        calls.append(tuple(embeds.shape[:2]))
        return real(embeds, mask, *rest, **named)
    monkeypatch.setattr(prefill_graphs, "lean_prefill", spy)
    return calls


def test_slices_bound_the_prefill_and_keep_every_rows_codes(lean, voices, prefills, monkeypatch):
    # x-vector and ICL voices: the ICL rows' longer prompts pad their groups
    words = "one two three four five six seven eight nine ten".split()
    lines = [Line(" ".join(words[:1 + i % 10]) + ".", voices["icl" if i % 4 == 0 else "xvec"], "English")
             for i in range(12)]
    batch = BatchTTS(lean)
    whole = batch.codes(lines, SETTINGS, batch_size=6)
    assert max(rows for rows, _ in prefills) == 6  # without a bound, the first group is prefilled at once
    assert sum(rows for rows, _ in prefills) == len(lines)

    prefills.clear()
    monkeypatch.setattr(settings, "PREFILL_TOKENS", 1)  # under any prompt: a row a slice
    one = batch.codes(lines, SETTINGS, batch_size=6)
    assert all(rows == 1 for rows, _ in prefills) and len(prefills) == len(lines), prefills
    for a, b in zip(whole, one, strict=True):
        assert torch.equal(a, b)

    prefills.clear()
    monkeypatch.setattr(settings, "PREFILL_TOKENS", 100)
    two = batch.codes(lines, SETTINGS, batch_size=6)
    assert all(rows * tokens <= 100 or rows == 1 for rows, tokens in prefills), prefills
    assert max(rows for rows, _ in prefills) > 1 and sum(rows for rows, _ in prefills) == len(lines), prefills
    for a, b in zip(whole, two, strict=True):
        assert torch.equal(a, b)
