"""The continuous batch over a paged key/value cache (morph/decode/kv_store.py PagedKV; tiny model, CPU, fp32, mode
"lean"): every row's codes are the dense batch's bit for bit while rows join, grow into new pages, are moved down and
compacted into narrower steps, and end; a pool too small for every row at once makes rows wait for pages rather than
fail, and its peak stays within it; a row that could never fit is a clear error; render sizes its pool to its rows."""

from __future__ import annotations

import collections

import pytest
import torch

from morph.continuous import RowRunner
from morph.prompts import make_rows, prompt_tokens, stream_keys, token_count
from morph.scheduler import Line
from morph.settings import GenerationSettings, Sampling

SETTINGS = GenerationSettings(seq_groups=5, do_sample=False, subtalker=Sampling(do_sample=False), seed=3,
                              max_new_tokens=64)
TEXTS = ["one two three four.", "five six.", "seven eight nine ten eleven.", "twelve.", "thirteen fourteen.",
         "fifteen sixteen seventeen.", "eighteen.", "nineteen twenty twenty-one twenty-two."]
ENDS = [41, 9, 60, 17, 33, 52, 12, 46]  # each row's last frame: the batch narrows and refills as they end


def render(tts, voice, width, pages, texts=TEXTS, ends=ENDS):
    """Every row's codes through one RowRunner, and what the batch says it did."""
    rows = make_rows(tts, [Line(t, voice, "English") for t in texts], SETTINGS, "test", True)
    stops = {r: e for r, e in zip(rows, ends, strict=True)}
    count = token_count(tts)
    need = max(prompt_tokens(r.text, voice, "", count) + stops[r] + 1 for r in rows)
    pending = collections.deque(zip(rows, stream_keys(rows, SETTINGS.seed), strict=True))
    codes = {}
    runner = RowRunner(tts, SETTINGS, width, need, stops.get, lambda r, c: codes.__setitem__(r.index, c),
                       audio=False, pages=pages)
    runner.run(lambda n: [pending.popleft() for _ in range(min(n, len(pending)))])
    return codes, dict(tts.patch.loop.last_run)


def test_a_paged_batch_gives_the_dense_batchs_codes(lean, voices):
    dense, _ = render(lean, voices["icl"], 4, None)
    paged, run = render(lean, voices["icl"], 4, 64)
    assert sorted(paged) == list(range(len(TEXTS)))
    for i in dense:
        assert torch.equal(paged[i], dense[i]), i
    assert run["pages"] == 63 and 0 < run["peak_pages"] <= 63
    assert len(run["widths"]) > 1  # the step narrowed: rows were compacted through their tables
    # every page came back, and no slot's table still points at one (a free slot's step writes through its table)
    assert not lean.patch.loop._state.table.any()


def test_a_small_pool_makes_rows_wait_for_pages(lean, voices):
    """Room for about two rows at a time in a batch of four slots: the rest wait for pages, and all finish with the
    dense batch's codes."""
    dense, _ = render(lean, voices["xvec"], 4, None)
    paged, run = render(lean, voices["xvec"], 4, 9)
    for i in dense:
        assert torch.equal(paged[i], dense[i]), i
    assert run["peak_pages"] <= 8


def test_a_row_that_can_never_fit_is_a_clear_error(lean, voices):
    with pytest.raises(RuntimeError, match="more key/value cache pages than the whole pool"):
        render(lean, voices["icl"], 4, 2)


def test_rows_moved_down_keep_their_pages(lean, voices, monkeypatch):
    """Three times the lines two at a time run past the cache's capacity, so the batch moves its rows down (their
    table entries, a whole number of pages); their codes stay the dense batch's."""
    from morph.decode import kv_store

    shifts = []
    shift = kv_store.PagedKV.shift
    monkeypatch.setattr(kv_store.PagedKV, "shift", lambda self, n, at: (shifts.append(n), shift(self, n, at)))
    dense, _ = render(lean, voices["xvec"], 2, None, TEXTS * 3, ENDS * 3)
    paged, _ = render(lean, voices["xvec"], 2, 64, TEXTS * 3, ENDS * 3)
    assert shifts and all(n % kv_store.PAGE == 0 for n in shifts)
    for i in dense:
        assert torch.equal(paged[i], dense[i]), i


def test_render_sizes_its_pool_to_the_widest_rows_or_takes_the_one_given(lean, voices):
    """render(continuous=True) takes a pool of what the `batch_size` largest rows could reserve at once
    (settings.pool_pages of each row's prompt, frame limit and EOS slot); a pool of a given size gives the same audio;
    static batches take no pool."""
    from morph.scheduler import BatchTTS
    from morph.settings import pool_pages

    lines = [Line(t, voices["xvec"], "English") for t in TEXTS[:3]]
    settings = GenerationSettings(seed=5, max_new_tokens=12)
    sized = BatchTTS(lean).render(lines, settings, batch_size=2, continuous=True)
    run = dict(lean.patch.loop.last_run)
    count = token_count(lean)
    needs = [prompt_tokens(t, voices["xvec"], "", count) + 12 + 1 for t in TEXTS[:3]]
    assert run["pages"] == pool_pages(needs, 2) - 1 and 0 < run["peak_pages"] <= run["pages"]
    given = BatchTTS(lean).render(lines, settings, batch_size=2, continuous=True, kv_cache_bytes=1 << 20)
    assert lean.patch.loop.last_run["pages"] != run["pages"]
    assert all(torch.equal(torch.from_numpy(a), torch.from_numpy(b)) for a, b in zip(sized, given, strict=True))
    with pytest.raises(ValueError, match="set continuous=True"):
        BatchTTS(lean).render(lines, settings, batch_size=2, kv_cache_bytes=1 << 20)
