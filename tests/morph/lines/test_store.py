"""morph.lines.store without ComfyUI: what a CLI or a distributed job gets from the line store."""

import json

import numpy as np
import pytest
import torch

from morph.lines.store import LineFiles, LineStore, fingerprint, join_clips, srt
from morph.lines.voice import Voice


def voice(seed=0):
    return Voice(spk_embedding=torch.randn(8, generator=torch.Generator().manual_seed(seed)), ref_code=None,
                 ref_text=None, model_size="0b6")


def test_a_saved_line_is_reused_only_with_the_same_fingerprint(tmp_path):
    context = dict(model="tiny", settings={"seq_groups": 5})
    mark = fingerprint(context, "Alice", "Hello.", voice())
    wav = np.linspace(-0.5, 0.5, 2400, dtype=np.float32)
    store = LineStore(tmp_path, "scene/one", "test")
    store.write_line(1, "Alice Smith", wav)
    store.record([(1, "Alice Smith", "Hello.", mark)])
    store.finish(1, "subtitles")
    assert sorted(p.name for p in (tmp_path / "scene").iterdir()) == ["one.srt", "one_0001_Alice_Smith.wav",
                                                                     "one_lines.json"]
    manifest = json.loads((tmp_path / "scene" / "one_lines.json").read_text())
    assert manifest["lines"]["0001"]["fingerprint"] == mark

    again = LineStore(tmp_path, "scene/one", "test")
    assert np.array_equal(again.load(1, "Alice Smith", mark), wav)
    assert again.load(1, "Alice Smith", fingerprint(context, "Alice", "Hello.", voice(1))) is None  # another voice
    assert again.load(1, "Alice Smith", fingerprint(context, "Alice", "Hello!", voice())) is None  # another text


@pytest.mark.parametrize("prefix", ["", "/abs/path", "../up", "C:/x"])
def test_a_prefix_outside_the_root_is_refused(tmp_path, prefix):
    with pytest.raises(ValueError, match="must be a relative name inside the output folder"):
        LineStore(tmp_path, prefix, "test")


def test_clips_join_with_pauses_and_the_cues_time_them():
    clips = [np.ones(24000, np.float32), np.ones(12000, np.float32)]
    joined, cues = join_clips(clips, 0.5)
    assert joined.size == 24000 + 12000 + 12000 and cues == [(0.0, 1.0), (1.5, 2.0)]
    assert srt([(*cues[1], "Bob", "Hi.")]) == "1\n00:00:01,500 --> 00:00:02,000\nBob: Hi.\n"


def test_the_dialogue_joined_from_the_files_is_the_one_joined_in_memory(tmp_path):
    """A distributed job joins its dialogue from the line files, one at a time; the same samples as join_clips."""
    rng = np.random.default_rng(0)
    clips = [rng.uniform(-1, 1, n).astype(np.float32) for n in (2400, 0, 777)]
    files = LineFiles(tmp_path, "s", "test")
    for i, clip in enumerate(clips):
        files.write_line(i + 1, f"n{i}", clip)
    import soundfile as sf

    joined = sf.read(files.join_lines(["n0", "n1", "n2"], 0.25), dtype="float32")[0]
    np.testing.assert_array_equal(joined, join_clips(clips, 0.25)[0])
