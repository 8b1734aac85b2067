"""MorphTTS.ready and LiveEngine.ready (issue 79's closed shape set): after it, and after the voices are made,
renders whose rows join at every count, in x-vector and ICL voices of two reference lengths, capture nothing: the
step's widths, every prefill bucket their joins meet and the codec's call shapes (rows join on its 4-frame grid) were
captured before the first render. Nor do a server's requests coming alone and in bursts of up to five at once, in
an x-vector voice and an ICL voice of a long reference; nor does the engine's thread wait for the GPU as they join,
leave and stream (issue 79: joining costs the loop nothing), by torch's own report of synchronizing calls."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

from morph import graphs
from morph.api import MorphTTS
from morph.engine.thread import LiveEngine
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings

WIDTH = 16


@pytest.fixture(scope="module")
def captured(tiny_dir, ref_wave):
    """The roles of the graphs two renders captured after ready() and the voices (graphs.capture's calls)."""
    tts = MorphTTS.load(str(tiny_dir), device="cuda", dtype="fp32", mode="fused")
    assert tts.ready(WIDTH) is not None
    voices = [tts.make_voice(ref_wave, 24000), tts.make_voice(ref_wave, 24000, "A short reference sentence."),
              tts.make_voice(ref_wave[:30000], 24000, "Short.")]  # ICL references of two lengths
    ends = {f"Line {i}, which runs for its own length.": 4 + (7 * i) % 37 for i in range(3 * WIDTH)}
    lines = [Line(text, voices[i % len(voices)], "English") for i, text in enumerate(ends)]
    batch = BatchTTS(tts)
    batch.stop = lambda row: min(row.limit, ends[row.text])  # rows end at many frames: joins of every count
    roles = []
    real = graphs.capture
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graphs, "capture", lambda *a, **k: roles.append(k.get("role", a[3:])) or real(*a, **k))
        for _ in range(2):
            audio = batch.render(lines, GenerationSettings(seed=0, min_new_tokens=40), batch_size=WIDTH)
            assert len(audio) == len(lines) and all(a.size for a in audio)
    tts.release_device_state()
    torch.cuda.empty_cache()
    return roles


def test_renders_after_ready_and_the_voices_capture_nothing(captured):
    assert captured == []


def test_a_servers_requests_alone_and_in_bursts_capture_nothing_after_ready_nor_wait_for_the_gpu(tiny_dir, ref_wave,
                                                                                                   monkeypatch):
    tts = MorphTTS.load(str(tiny_dir), device="cuda", dtype="fp32", mode="fused")
    engine = LiveEngine(tts, width=WIDTH, max_frames=64, max_prompt=600)
    try:
        assert engine.ready() is not None
        # an x-vector voice, and an ICL one of a 24 s reference: its prompts are over 300 tokens
        voices = [tts.make_voice(ref_wave, 24000),
                  tts.make_voice(np.tile(ref_wave, 12), 24000, "A long reference, spoken twelve times over.")]
        roles, errors, real = [], [], graphs.capture
        monkeypatch.setattr(graphs, "capture", lambda *a, **k: roles.append(k.get("role", a[3:])) or real(*a, **k))
        syncs = []  # (thread, file, line) of each synchronizing call torch reports
        monkeypatch.setattr(warnings, "showwarning", lambda message, category, filename, lineno, *rest: syncs.append(
            (threading.current_thread().name, filename, lineno)) if "synchronizing" in str(message) else None)
        bursts = (1, 2, 3, 4, 5, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for burst in bursts:
                    ended = [threading.Event() for _ in range(burst)]
                    with engine.engine.cv:  # queued together: they join at the same frame
                        for i, done in enumerate(ended):
                            engine.submit(Line(f"Request {i} of a burst of {burst}." * (1 + i), voices[i % 2],
                                               "English"),
                                          GenerationSettings(seed=i, max_new_tokens=8 + 5 * i), lambda wav: None,
                                          lambda error, done=done: (errors.append(error), done.set()))
                    assert all(done.wait(120) for done in ended)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        assert errors == [None] * sum(bursts) and roles == []
        # the prompts are built on the submitting thread, whose copies may wait; the engine's thread must not
        assert syncs and [s for s in syncs if s[0] == "morph-engine"] == []
    finally:
        engine.close()
        tts.release_device_state()
        torch.cuda.empty_cache()
