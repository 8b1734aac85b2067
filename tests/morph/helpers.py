"""Test helpers for the engine: capture the codec codes a generate call produced."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def recorded_codes(tts):
    """Record the [frames, 16] code tensors that qwen-tts's model.generate returns."""
    model = tts.model
    original = model.generate
    calls = []

    def generate(*args, **kwargs):
        codes, hidden = original(*args, **kwargs)
        calls.append([c.clone() for c in codes])
        return codes, hidden

    model.generate = generate
    try:
        yield calls
    finally:
        del model.generate
