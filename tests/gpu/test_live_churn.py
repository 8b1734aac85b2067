"""The live engine (what the speech server runs) under churn, at the real 0.6B dims: requests joining, ending and
cancelled at random times for about half a minute, as the load test that once ended the server's process with a
device-side assert did (a 0.6B CustomVoice model, a built-in speaker, 64 slots, Poisson arrivals at 1, then 10, then
20 requests a second). Every request must end whole or cancelled, with finite audio, and the GPU stay usable."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import torch

from bench.random_model import build_random_model
from morph.engine import MorphTTS
from morph.lines.line import Line
from morph.live_engine import Busy, LiveEngine
from morph.settings import GenerationSettings

WORDS = ("the quick brown fox jumps over a lazy dog while seven tired sailors sing about distant harbours and "
         "nobody remembers the name of the small grey town").split()


def test_requests_joining_ending_and_cancelled_at_random_times_all_end(tmp_path):
    folder = build_random_model(tmp_path / "cv", "0.6b", "custom_voice", seed=0, dtype=torch.bfloat16)
    tts = MorphTTS.load(str(folder), device="cuda", dtype="bf16")
    engine = LiveEngine(tts, width=64)
    rng = random.Random(0)
    lock = threading.Lock()
    ends: dict[int, BaseException | None] = {}
    bad_audio: set[int] = set()
    requests = []

    def on_chunk(i):
        def chunk(wav: np.ndarray) -> None:
            if not np.isfinite(wav).all():
                bad_audio.add(i)
        return chunk

    def on_end(i):
        def end(error: BaseException | None) -> None:
            with lock:
                ends[i] = error
        return end

    try:
        for rate, seconds in ((1, 5), (10, 10), (20, 10)):
            window = time.monotonic()
            while time.monotonic() - window < seconds:
                time.sleep(rng.expovariate(rate))
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 35)))
                i = len(requests)
                try:
                    requests.append(engine.submit(Line(text, None, "English", speaker="ryan"),
                                                  GenerationSettings(max_new_tokens=rng.choice((12, 31, 62))),
                                                  on_chunk(i), on_end(i)))
                except Busy:
                    continue
                if rng.random() < 0.15:  # a client that leaves: any request so far, waiting, running or done
                    rng.choice(requests).cancel()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(r.state in ("waiting", "running") for r in requests):
            time.sleep(0.1)
        torch.cuda.synchronize()  # a device-side assert surfaces here at the latest
    finally:
        engine.close()
    states = [r.state for r in requests]
    assert len(requests) > 300
    assert set(states) <= {"done", "cancelled"}, [(i, s, ends.get(i)) for i, s in enumerate(states) if s not in
                                                  ("done", "cancelled")][:5]
    assert not [e for e in ends.values() if e is not None]
    assert states.count("done") > len(requests) // 2
    assert not bad_audio
