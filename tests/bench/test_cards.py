"""bench/cards.py on the CPU: what it counts as an out-of-memory retry is what a render logs when the engine (what
the cards run on a GPU) retried (the capped renders themselves need a GPU: tests/gpu/test_cards.py)."""

import json
import logging

import numpy as np
import torch

import morph.engine.engine
from bench.cards import _Retries
from morph.engine.runner import RowRunner
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings


def render_four(tts) -> _Retries:
    """Four short lines at batch 4, as bench.cards renders them: what its handler saw."""
    retries = _Retries()
    logging.getLogger("morph").addHandler(retries)
    try:
        voice = tts.make_voice((0.3 * np.sin(np.arange(24000) / 9.0)).astype(np.float32), 24000)
        lines = [Line(text, voice, "English") for text in ("One.", "Two.", "Three.", "Four.")]
        BatchTTS(tts).render(lines, GenerationSettings(max_new_tokens=4), batch_size=4)
    finally:
        logging.getLogger("morph").removeHandler(retries)
    return retries


def test_a_retry_at_half_the_batch_is_seen(tiny_tts, monkeypatch):
    failed = []

    class OutOfMemoryOnce(RowRunner):  # the first batch wider than one row runs out of memory
        def step(self, *args, **kwargs):
            if self.width > 1 and not failed:
                failed.append(self.width)
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")
            return super().step(*args, **kwargs)

    monkeypatch.setattr(morph.engine.engine, "RowRunner", OutOfMemoryOnce)
    monkeypatch.setattr(tiny_tts.patch, "mode", "lean")  # the engine, as every mode but eager renders
    retries = render_four(tiny_tts)
    assert failed == [4] and retries.seen and "finished with batches of at most 2 rows" in retries.seen[-1]


def test_a_batch_built_narrower_for_the_free_memory_is_recorded_apart_from_retries(tiny_tts, monkeypatch):
    """The engine builds a render's batch no wider than the GPU's free memory holds (here a reading of none): bench.cards
    records that as narrowed, no retry, and the render does not claim it ran out of memory."""
    monkeypatch.setattr(tiny_tts.patch, "mode", "lean")
    monkeypatch.setattr(morph.engine.engine, "free_bytes", lambda device: 0)  # not even one row's need
    built = []

    class Recorded(RowRunner):
        def __init__(self, tts, settings, width, *args, **kwargs):
            built.append(width)
            super().__init__(tts, settings, width, *args, **kwargs)

    monkeypatch.setattr(morph.engine.engine, "RowRunner", Recorded)
    retries = render_four(tiny_tts)
    assert built == [1] and retries.seen == []
    assert len(retries.narrowed) == 1 and "enough for a batch of 1 rows, not 4" in retries.narrowed[0]


def test_a_card_whose_process_fails_keeps_the_rows_it_finished_and_its_last_line(monkeypatch):
    """A card's process that dies (here in the release between two batch sizes) is reported with the rows it had
    printed and the error's last line, not the tail of its stderr cut anywhere."""
    import subprocess

    import bench.cards as cards

    done = {"batch_size": 8, "wall_s": 18.5, "x_real_time": 66.3, "retried": []}
    failed = {"batch_size": 4, "error": "OutOfMemoryError: CUDA out of memory. " + "x" * 3000, "retried": []}
    stderr = "\n".join(["a warning", json.dumps(done), json.dumps(failed), "Traceback (most recent call last):",
                        "torch.OutOfMemoryError: Tried to allocate 24.00 MiB"])
    monkeypatch.setattr(cards, "run_info", lambda device: {})
    monkeypatch.setattr(cards.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 1, stdout="", stderr=stderr))
    report = cards.main(["--cards", "6", "--batch-sizes", "8,4"])
    assert report["cards"] == [dict(card_gib=6.0, runs=[done, failed],
                                    error="torch.OutOfMemoryError: Tried to allocate 24.00 MiB")]
