"""bench/cards.py on the CPU: what it counts as an out-of-memory retry is what the scheduler logs when it retries
(the capped renders themselves need a GPU: tests/gpu/test_cards.py)."""

import logging

import numpy as np
import torch

from bench.cards import _Retries
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings


def test_a_retry_at_half_the_batch_is_seen(tiny_tts, monkeypatch):
    static, failed = BatchTTS._static, []

    def once_out_of_memory(self, rows, settings, width, *args):
        if width > 1 and not failed:
            failed.append(width)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")
        return static(self, rows, settings, width, *args)

    monkeypatch.setattr(BatchTTS, "_static", once_out_of_memory)
    retries = _Retries()
    logging.getLogger("morph.render").addHandler(retries)
    try:
        voice = tiny_tts.make_voice((0.3 * np.sin(np.arange(24000) / 9.0)).astype(np.float32), 24000)
        lines = [Line(text, voice, "English") for text in ("One.", "Two.", "Three.", "Four.")]
        BatchTTS(tiny_tts).render(lines, GenerationSettings(max_new_tokens=4), batch_size=4)
    finally:
        logging.getLogger("morph.render").removeHandler(retries)
    assert failed == [4] and retries.seen and "retrying in batches of 2" in retries.seen[0]
