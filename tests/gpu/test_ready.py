"""MorphTTS.ready (issue 79's closed shape set): after it, and after the voices are made, renders whose rows join at
every count, in x-vector and ICL voices of two reference lengths, capture nothing: the step's widths, every prefill
bucket their joins meet and the codec's call shapes (rows join on its 4-frame grid) were captured before the first
render."""

from __future__ import annotations

import pytest
import torch

from morph import graphs
from morph.api import MorphTTS
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
