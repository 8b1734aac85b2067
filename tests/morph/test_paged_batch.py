"""The continuous batch over a paged key/value cache (morph/decode/kv_store.py PagedKV; tiny model, CPU, fp32, mode
"lean"): every row's codes are the dense batch's bit for bit while rows join, grow into new pages, are moved down and
compacted into narrower steps, and end; a pool too small for every row at once makes rows wait for pages rather than
fail, and its peak stays within it; an overcommitted one preempts rows, which start again with the same codes; a row
that could never fit is a clear error; render sizes its pool to its rows."""

from __future__ import annotations

import collections

import pytest
import torch

from morph.prompts import prompt_tokens, token_count
from morph.render import Line
from morph.settings import GenerationSettings, Sampling
from .helpers import ran_runner, runner_codes

SETTINGS = GenerationSettings(seq_groups=5, do_sample=False, subtalker=Sampling(do_sample=False), seed=3,
                              max_new_tokens=64)
TEXTS = ["one two three four.", "five six.", "seven eight nine ten eleven.", "twelve.", "thirteen fourteen.",
         "fifteen sixteen seventeen.", "eighteen.", "nineteen twenty twenty-one twenty-two."]
ENDS = [41, 9, 60, 17, 33, 52, 12, 46]  # each row's last frame: the batch narrows and refills as they end


def render(tts, voice, width, pages, texts=TEXTS, ends=ENDS, overcommit=False):
    """Every row's codes through one RowRunner, and what the batch says it did."""
    assert len(ends) == len(texts)  # a short line each: one row each, its line's index
    lines = [Line(t, voice, "English") for t in texts]
    return runner_codes(tts, SETTINGS, lines, width, lambda row: ends[row.index], pages, overcommit)


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


LONG = [60] * len(TEXTS)  # rows that all run long: they outgrow the half of their frames set aside as they joined


def preempting(run):
    """run(pages) -> (result, the batch's last_run) at the first of a few small pools where a row was preempted
    (which pools do depends on the rows' prompts and, on a GPU, on how far behind the host learns of ended rows)."""
    for pages in range(5, 14):
        got, last = run(pages)
        if last["preemptions"]:
            return got, last, pages
    raise AssertionError("no pool of 5 to 13 pages preempted a row")


def test_an_overcommitted_pool_preempts_the_last_row_to_join_and_it_starts_again(lean, voices):
    """Rows join on their prompts' pages and half their frames' and grow into the pool's free pages; at a page the
    pool cannot give every row, the row that joined last gives its pages back and starts again from its first frame
    (its stream key with it): every row still ends with the dense batch's codes, once each, within the pool."""
    from morph.engine.batch import ContinuousBatch

    joins = collections.Counter()
    join = ContinuousBatch._join

    def spy(self, *args):
        before = {row.name for row in self.live.values()}
        joined = join(self, *args)
        joins.update(row.name.index for row in self.live.values() if row.name not in before)
        return joined

    dense, _ = render(lean, voices["xvec"], 4, None, TEXTS, LONG)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ContinuousBatch, "_join", spy)

        def run(pages):
            joins.clear()
            return render(lean, voices["xvec"], 4, pages, TEXTS, LONG, overcommit=True)
        paged, run, pages = preempting(run)
    assert sorted(paged) == list(range(len(TEXTS)))
    for i in dense:
        assert torch.equal(paged[i], dense[i]), i
    assert run["peak_pages"] <= pages - 1
    assert sum(joins.values()) == len(TEXTS) + run["preemptions"]  # each preempted row joined again
    assert not lean.patch.loop._state.table.any()  # every page came back


def test_rows_that_run_long_make_the_batch_set_more_aside(lean, voices):
    """Once a row has ended at its frame limit, joining rows set all their frames aside, as a pool that is not
    overcommitted has them do: rows that run long wait for pages instead of being preempted half way."""
    paged, run = render(lean, voices["xvec"], 4, 9, TEXTS * 3, LONG * 3, overcommit=True)
    waiting, _ = render(lean, voices["xvec"], 4, 9, TEXTS * 3, LONG * 3)
    for i in waiting:
        assert torch.equal(paged[i], waiting[i]), i
    assert run["preemptions"] <= 1  # at most in the first rows, which join before any has ended


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
    """render takes a pool of what the `batch_size` largest rows take at a share of their frame
    limits (settings.requeue_pool_pages of each row's prompt and frame limit: a row it cannot grow starts again), or,
    streamed, what they could reserve at once (settings.pool_pages); a pool of a given size gives the same audio;
    eager mode's static batches take no pool."""
    from morph.render import BatchTTS
    from morph.settings import pool_pages, requeue_pool_pages

    lines = [Line(t, voices["xvec"], "English") for t in TEXTS[:3]]
    settings = GenerationSettings(seed=5, max_new_tokens=40)
    sized = BatchTTS(lean).render(lines, settings, batch_size=2)
    run = dict(lean.patch.loop.last_run)
    count = token_count(lean)
    prompts = [prompt_tokens(t, voices["xvec"], "", count) for t in TEXTS[:3]]
    assert run["pages"] == requeue_pool_pages([(p, 40) for p in prompts], 2) - 1 and 0 < run["peak_pages"]
    assert run["peak_pages"] <= run["pages"] < pool_pages([p + 40 + 1 for p in prompts], 2) - 1
    BatchTTS(lean).render(lines, settings, batch_size=2, on_chunk=lambda row, wav: None)
    assert lean.patch.loop.last_run["pages"] == pool_pages([p + 40 + 1 for p in prompts], 2) - 1
    given = BatchTTS(lean).render(lines, settings, batch_size=2, kv_cache_bytes=1 << 20)
    assert lean.patch.loop.last_run["pages"] != run["pages"]
    assert all(torch.equal(torch.from_numpy(a), torch.from_numpy(b)) for a, b in zip(sized, given, strict=True))
    lean.patch.mode = "eager"
    with pytest.raises(ValueError, match="paged cache, which eager mode does not run; set the speed mode to fused"):
        BatchTTS(lean).render(lines, settings, batch_size=2, kv_cache_bytes=1 << 20)


def test_a_preempted_rows_audio_is_its_take_from_the_start(lean, voices, monkeypatch):
    """Through render, each row decoded while it is made: a row preempted after its first chunks went to the codec
    starts again with a fresh codec state, and every line's audio is what a pool that preempts nothing gives (to fp32
    rounding: the codec's calls group other rows)."""
    import numpy as np

    import morph.engine.engine
    from morph.render import BatchTTS

    lines = [Line(t, voices["xvec"], "English") for t in TEXTS]
    settings = GenerationSettings(seed=5, max_new_tokens=60)
    roomy = BatchTTS(lean).render(lines, settings, batch_size=4)
    assert lean.patch.loop.last_run["preemptions"] == 0

    def run(pages):
        lean.release_device_state()  # a kept pool of another size would be taken over
        monkeypatch.setattr(morph.engine.engine, "requeue_pool_pages", lambda rows, width: pages)
        return BatchTTS(lean).render(lines, settings, batch_size=4), lean.patch.loop.last_run
    tight, last, pages = preempting(run)
    assert last["pages"] == pages - 1
    for a, b in zip(roomy, tight, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_a_slot_no_row_holds_steps_inside_the_rotary_tables(lean, voices):
    """A free slot still steps while its width runs, however long (a preempted row's slot waits for a row to end
    before another joins): its rotary position stays inside the tables, where it once ran past them (an IndexError
    on the CPU, an out-of-bounds read on a GPU), and no live row's is changed."""
    runner, _ = ran_runner(lean, SETTINGS, [Line(t, voices["xvec"], "English") for t in TEXTS[:2]], 2, lambda r: 20,
                           pages=16)
    st, last = runner.batch.st, runner.batch.st.cos.shape[0] - 1
    st.rope_pos.copy_(torch.tensor([last - 1, last]))
    with torch.inference_mode():  # as ContinuousBatch.steps runs it (its steps are built in inference mode)
        runner.batch._steps[2]()
    assert st.rope_pos.tolist() == [last, last]
