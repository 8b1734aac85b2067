"""bench/fidelity.py's plumbing on the tiny random model: no quality claim, random weights speak noise."""

import json

import pytest
import soundfile as sf

from bench import fidelity


def test_fidelity_end_to_end(tiny_dir, ref_audio, tmp_path, monkeypatch):
    # a device copy of the tree has no usable .git: the commit comes from what the caller recorded
    monkeypatch.setenv("PROJECT_COMMIT", "0123abc")
    wave, sr = ref_audio
    clips = tmp_path / "clips"
    clips.mkdir()
    sf.write(clips / "icl.wav", wave, sr)
    (clips / "icl.txt").write_text("A short reference sentence.")
    sf.write(clips / "xvec.flac", wave[::2], sr // 2)  # no transcript: x-vector only, another rate
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello there.\n\n")
    out = tmp_path / "fidelity.json"
    report = fidelity.main(["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32", "--clips", str(clips),
                            "--texts", str(texts), "--seq-groups", "4", "--max-new-tokens", "4", "--json", str(out),
                            "--markdown", str(tmp_path / "fidelity.md")])
    assert json.loads(out.read_text())["summary"] == report["summary"]
    assert report["commit"] == "0123abc"
    assert report["clips"] == ["icl", "xvec"] and report["texts"] == ["Hello there."]
    assert [(r["clip"], r["icl"], r["seq_groups"]) for r in report["rows"]] == \
        [("icl", True, 15), ("icl", True, 4), ("xvec", False, 15), ("xvec", False, 4)]
    for r in report["rows"]:
        assert -1 <= r["speaker_similarity"] <= 1 and r["cer"] is None
    assert report["summary"]["15"]["code_agreement"] == {}
    for a in report["code_agreement"]:
        assert 1 <= a["frames"] <= 4 and list(a["4"]) == [str(g) for g in range(5, 16)]
        assert all(0 <= v <= 1 for v in a["4"].values())
    table = (tmp_path / "fidelity.md").read_text()
    assert "| 4 |" in table and "(sequential)" not in table


def test_cer():
    assert fidelity.cer("Hello, world!", "hello world") == 0
    assert fidelity.cer("abcd", "abed") == pytest.approx(0.25)
    assert fidelity.cer("abc", "") == 1
    assert fidelity.cer("ab", "abcd") == 1  # insertions count too


def test_missing_clips_say_so(tmp_path):
    with pytest.raises(ValueError, match="no .wav"):
        fidelity.load_clips(tmp_path)
