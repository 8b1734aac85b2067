"""Test helpers for the engine: capture the codec codes a generate call produced; run rows through one RowRunner."""

from __future__ import annotations

import collections
import contextlib

from morph.engine.runner import RowRunner
from morph.prompts import make_rows, prompt_tokens, stream_keys, token_count


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


def ran_runner(tts, settings, lines, width: int, stop, pages=None, overcommit: bool = False,
               ahead: bool = False) -> tuple[RowRunner, dict]:
    """One RowRunner with no codec after it has run `lines`' rows, each ending at stop(row) at the latest, and every
    row's codes (line index -> [frames, 16]); pages, overcommit and ahead as RowRunner and its step take them."""
    rows = make_rows(tts, lines, settings, "test", True)
    count = token_count(tts)
    prompt = max(prompt_tokens(r.text, r.line.voice, "", count) for r in rows)
    need = prompt + max(stop(r) for r in rows) + 1
    pending = collections.deque(zip(rows, stream_keys(rows, settings.seed), strict=True))
    codes = {}
    runner = RowRunner(tts, settings, width, need, prompt, stop, lambda r, c: codes.__setitem__(r.index, c), audio=False,
                       pages=pages, overcommit=overcommit)
    while runner.step(lambda n: [pending.popleft() for _ in range(min(n, len(pending)))],
                      put_back=pending.appendleft, ahead=ahead):
        pass
    return runner, codes


def runner_codes(tts, settings, lines, width: int, stop, pages=None, overcommit: bool = False,
                 ahead: bool = False) -> tuple[dict, dict]:
    """ran_runner's codes, and what the batch says it did (its last_run)."""
    _, codes = ran_runner(tts, settings, lines, width, stop, pages, overcommit, ahead)
    return codes, dict(tts.patch.loop.last_run)
