"""morph.script_job on the tiny model (CPU): what a stopped job keeps and says, and what its rerun finds."""

import errno
import json
import logging
import os
import re
import threading
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

import morph.script_job

from morph.lines.files import LineWriteError
from morph.lines.script import parse_script
from morph.lines.store import LineStore
from morph.render import Line
from morph.script_job import ScriptJob
from morph.settings import GenerationSettings, Sampling

SCRIPT = "A: Hello there.\nA: How are you today?\nA: Fine, thanks.\nA: Good to hear."
SETTINGS = GenerationSettings(do_sample=False, subtalker=Sampling(do_sample=False), max_new_tokens=4)


@pytest.fixture(scope="module")
def voice(tiny_tts):
    rng = np.random.RandomState(0)
    t = np.arange(2 * 24000) / 24000
    return tiny_tts.make_voice((0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.randn(t.size)).astype(np.float32),
                               24000)


def run(tts, voice, folder, **more):
    parsed = parse_script(SCRIPT, ["A"])
    with LineStore(folder, "s", "test") as store:
        job = ScriptJob(parsed, [Line(p.text, voice) for p in parsed], store, {"model": "tiny"}, rerun="run it again")
        kept = job.reuse()
        return kept, job.run(lambda todo: tts, SETTINGS, batch_size=1, pause_seconds=0.1, **more)


def test_a_full_disk_mid_job_names_the_file_keeps_the_lines_done_and_a_rerun_resumes(tiny_tts, voice, tmp_path,
                                                                                     monkeypatch):
    replace, calls = os.replace, []

    def fill_at_the_third_line(source, target):  # the third line's file (the manifest's writes go on)
        if str(target).endswith(".wav"):
            calls.append(target)
            if len(calls) == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace(source, target)

    monkeypatch.setattr(os, "replace", fill_at_the_third_line)
    with pytest.raises(LineWriteError) as stopped:
        run(tiny_tts, voice, tmp_path)
    named = re.fullmatch(rf"test: could not write {re.escape(str(tmp_path))}/(s_000\d_A\.wav): No space left on device; "
                         rf"free some space on its disk; 2 of 4 lines are kept in {re.escape(str(tmp_path))}; run it "
                         r"again to render the rest", str(stopped.value))
    assert named, str(stopped.value)
    recorded = [e["file"] for e in json.loads((tmp_path / "s_lines.json").read_text())["lines"].values()]
    assert len(recorded) == 2 and named[1] not in recorded
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(recorded + ["s_lines.json"])  # no partial file

    monkeypatch.setattr(os, "replace", replace)
    kept, result = run(tiny_tts, voice, tmp_path)
    assert kept == 2 and len(result.clips) == 4
    assert list(json.loads((tmp_path / "s_lines.json").read_text())["lines"]) == ["0001", "0002", "0003", "0004"]


def test_a_rerun_after_a_stop_between_writing_and_recording_says_what_it_found(tiny_tts, voice, tmp_path,
                                                                              monkeypatch, caplog):
    record, calls = LineStore.record, []

    def stop_at_the_second_record(self, written):
        calls.append(written)
        if len(calls) == 2:  # line 2's file is on disk, its entry is not
            raise KeyboardInterrupt
        record(self, written)

    monkeypatch.setattr(LineStore, "record", stop_at_the_second_record)
    monkeypatch.setattr(morph.script_job, "RECORD_EVERY_S", 0)  # a record per line
    with pytest.raises(KeyboardInterrupt):
        run(tiny_tts, voice, tmp_path)
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="morph"):
        kept, _ = run(tiny_tts, voice, tmp_path)
    assert kept == 1
    said = [r.getMessage() for r in caplog.records if "already rendered" in r.getMessage()]
    assert len(said) == 1 and re.fullmatch(
        r"test: 1 of 4 lines already rendered in .+ \(rendering again: 1 written by a run that stopped before "
        r"recording them\); rendering 3", said[0]), said


def test_a_file_changed_after_it_was_recorded_is_rendered_again(tiny_tts, voice, tmp_path):
    _, first = run(tiny_tts, voice, tmp_path)
    (tmp_path / "s_0002_A.wav").write_bytes((tmp_path / "s_0001_A.wav").read_bytes())  # another line's take
    kept, again = run(tiny_tts, voice, tmp_path)
    assert kept == 3 and np.array_equal(again.clips[1], first.clips[1])


def test_lines_are_finished_beside_the_render_and_all_of_them_before_the_job_returns(tiny_tts, voice, tmp_path):
    """Each line is smoothed and written on a thread of its own while the render goes on (the first line's finish
    waits until the render has stepped again, which would never happen were it finished on the render's thread), in
    the order the render hands them over, and the job returns with every file written and recorded."""
    steps, finished_on, went_on, handed = [], [], [], []

    def finish(wav):
        if not finished_on:
            seen, deadline = len(steps), time.monotonic() + 30
            while len(steps) == seen and time.monotonic() < deadline:
                time.sleep(0.005)
            went_on.append(len(steps) > seen)
        finished_on.append(threading.current_thread())
        return wav

    _, result = run(tiny_tts, voice, tmp_path, finish_line=finish, on_step=lambda *progress: steps.append(progress),
                    on_line=lambda i, wav: handed.append(i))
    assert went_on == [True]
    assert len(finished_on) == 4 and threading.current_thread() not in finished_on
    assert sorted(handed) == [0, 1, 2, 3] and len(result.clips) == 4
    recorded = json.loads((tmp_path / "s_lines.json").read_text())["lines"]
    assert sorted(recorded) == ["0001", "0002", "0003", "0004"]
    assert all((tmp_path / entry["file"]).exists() for entry in recorded.values())


@pytest.mark.parametrize("dialogue, need", [(False, (56 + 4 * 24000) + (56 + 4 * 48000)),
                                            # and the dialogue: both lines and one pause of 0.5 s
                                            (True, (56 + 4 * 24000) + (56 + 4 * 48000) + 56 + 4 * 84000)])
def test_a_job_that_would_not_fit_on_its_disk_is_refused_before_its_first_line(tmp_path, monkeypatch, dialogue, need):
    """Lines to render are estimated at 15 characters a second (these: 1 s and 2 s)."""
    from morph.lines import files
    from morph.lines.voice import Voice
    import torch

    usage = namedtuple("usage", "total used free")
    voice = Voice(spk_embedding=torch.zeros(8), ref_code=None, ref_text=None, model_size="0b6")
    parsed = parse_script("A: Fifteen chars..\nA: And this line is thirty chars.\n", ["A"])
    assert [len(p.text) for p in parsed] == [15, 30]

    def unwanted(todo):
        raise AssertionError("rendering began")

    for free, fits in ((need, True), (need - 1, False)):
        monkeypatch.setattr(files.shutil, "disk_usage", lambda folder, free=free: usage(10**12, 0, free))
        with LineStore(tmp_path, "s", "test") as store:
            job = ScriptJob(parsed, [Line(p.text, voice) for p in parsed], store, {"model": "tiny"})
            if fits:
                job.check_space(0.5, dialogue)
                continue
            with pytest.raises(LineWriteError, match=rf"^test: this job writes about {need / 1e6:.1f} MB into .+, and "
                                                     r"its disk has .+ free; free some space there, or give the job an "
                                                     r"output folder on another disk$"):
                job.run(unwanted, SETTINGS, batch_size=1, pause_seconds=0.5, dialogue=dialogue)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written


def test_a_line_already_rendered_counts_its_own_length(tmp_path, monkeypatch):
    from morph.lines import files
    from morph.lines.voice import Voice
    import torch

    usage = namedtuple("usage", "total used free")
    voice = Voice(spk_embedding=torch.zeros(8), ref_code=None, ref_text=None, model_size="0b6")
    parsed = parse_script("A: Fifteen chars..\nA: And this line is thirty chars.\n", ["A"])
    need = (56 + 4 * 48000) + 56 + 4 * (1000 + 48000)  # line 2 to render; line 1 kept, 1,000 samples; no pause
    with LineStore(tmp_path, "s", "test") as store:
        job = ScriptJob(parsed, [Line(p.text, voice) for p in parsed], store, {"model": "tiny"})
        job.lengths[0] = 1000
        monkeypatch.setattr(files.shutil, "disk_usage", lambda folder: usage(10**12, 0, need))
        job.check_space(0.0, True)
        monkeypatch.setattr(files.shutil, "disk_usage", lambda folder: usage(10**12, 0, need - 1))
        with pytest.raises(LineWriteError):
            job.check_space(0.0, True)


def test_the_manifest_takes_the_lines_written_at_most_every_second_and_all_of_them_at_the_end(monkeypatch):
    """The first line is recorded at once, the lines written within RECORD_EVERY_S of a record wait for the next one
    (a record per line rewrote the manifest once per line: quadratic), and leaving the block records the rest, a
    failed line's companions included."""
    clock = [0.0]
    monkeypatch.setattr(morph.script_job.time, "monotonic", lambda: clock[0])
    records = []

    def finish(k, wav, written):
        clock[0] += 0.3 if k < 6 else 0.0
        if wav is None:
            raise OSError("disk full")
        written.append((k, f"file {k}"))

    with morph.script_job._LineWriter(finish, records.append) as hand_over:
        for k in range(6):
            hand_over(k, "audio")
    assert [[k for k, _ in r] for r in records] == [[0], [1, 2, 3, 4], [5]]  # 0.3 s a line
    records.clear()
    with pytest.raises(OSError, match="disk full"):
        with morph.script_job._LineWriter(finish, records.append) as hand_over:
            for k in (6, 7):
                hand_over(k, "audio")
            hand_over(8, None)
    assert [[k for k, _ in r] for r in records] == [[6], [7]]


def test_a_lines_fingerprint_keeps_its_value_at_upstreams_eos_hold_and_changes_with_another():
    """A job rendered before min_new_tokens was a setting resumes: at upstream's 2 the line's fingerprint is the one
    it had then (this literal); another hold makes other audio, so another fingerprint."""
    from morph.config import ModelConfig
    from morph.lines.store import fingerprint
    from morph.script_job import job_context

    config = ModelConfig("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", Path("models/x"), "custom_voice", "0.6B",
                         torch.device("cuda", 0), torch.bfloat16, "sdpa", "auto")

    def line(settings):
        context = job_context(config, "English", settings, True)
        return fingerprint(context, "Alice", "Hello there.", speaker="vivian", instruct="")

    assert line(GenerationSettings()) == "9b10ecc7bdf1cc5d92f6a1296561d1182aaf40b7e934cfa67aa0332d718232e6"
    assert line(GenerationSettings(min_new_tokens=6)) != line(GenerationSettings())
