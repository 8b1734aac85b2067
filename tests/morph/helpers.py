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


def storage_bytes(module) -> int:
    """Bytes of the distinct storages behind a module's parameters (views count once)."""
    storages = {}
    for p in module.parameters():
        s = p.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())
