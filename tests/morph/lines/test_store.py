"""morph.lines.store without ComfyUI: what a CLI or a distributed job gets from the line store."""

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from morph.lines.files import LineWriteError, write_atomic
from morph.lines.job_lock import JobBusy
from morph.lines.store import LineFiles, LineStore, fingerprint, join_clips, srt
from morph.lines.voice import Voice


def voice(seed=0):
    return Voice(spk_embedding=torch.randn(8, generator=torch.Generator().manual_seed(seed)), ref_code=None,
                 ref_text=None, model_size="0b6")


def test_a_saved_line_is_reused_only_with_the_same_fingerprint(tmp_path):
    context = dict(model="tiny", settings={"seq_groups": 5})
    mark = fingerprint(context, "Alice", "Hello.", voice())
    wav = np.linspace(-0.5, 0.5, 2400, dtype=np.float32)
    with LineStore(tmp_path, "scene/one", "test") as store:
        written = store.write_line(1, "Alice Smith", wav)
        store.record([(1, "Alice Smith", "Hello.", mark, written)])
        store.finish(1, "subtitles")
    assert sorted(p.name for p in (tmp_path / "scene").iterdir()) == ["one.srt", "one_0001_Alice_Smith.wav",
                                                                     "one_lines.json"]
    entry = json.loads((tmp_path / "scene" / "one_lines.json").read_text())["lines"]["0001"]
    data = (tmp_path / "scene" / "one_0001_Alice_Smith.wav").read_bytes()
    assert entry == dict(file="one_0001_Alice_Smith.wav", name="Alice Smith", text="Hello.", fingerprint=mark,
                         samples=2400, sha256=hashlib.sha256(data).hexdigest())

    with LineStore(tmp_path, "scene/one", "test") as again:
        assert np.array_equal(again.load(1, "Alice Smith", mark), wav)
        assert again.load(1, "Alice Smith", fingerprint(context, "Alice", "Hello.", voice(1))) is None  # another voice
        assert again.load(1, "Alice Smith", fingerprint(context, "Alice", "Hello!", voice())) is None  # another text
        assert again.changed == 2


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
    path = files.join_lines(["n0", "n1", "n2"], 0.25)
    assert path == tmp_path / "s.wav" and path.stat().st_size == 56 + 4 * (2400 + 777 + 2 * 6000)
    np.testing.assert_array_equal(sf.read(path, dtype="float32")[0], join_clips(clips, 0.25)[0])


# -- a rerun trusts a file only while it is the one recorded ------------------------------------------------------
def stored(folder, clips, prefix="s"):
    """A finished store of these clips (lines 1..n, all spoken by 'A'), and each line's fingerprint."""
    marks = [fingerprint({}, "A", f"line {i}", voice()) for i in range(len(clips))]
    with LineStore(folder, prefix, "test") as store:
        store.record([(i + 1, "A", f"line {i}", marks[i], store.write_line(i + 1, "A", clip))
                      for i, clip in enumerate(clips)])
        store.finish(len(clips), "")
    return marks


def test_a_file_that_is_not_the_recorded_one_is_rendered_again(tmp_path):
    clips = [np.full(2400, 0.25, np.float32), np.full(2400, 0.5, np.float32), np.full(2400, 0.75, np.float32)]
    marks = stored(tmp_path, clips)
    LineFiles(tmp_path, "s", "test").write_line(1, "A", np.full(4800, 0.25, np.float32))  # another job's take
    LineFiles(tmp_path, "s", "test").write_line(2, "A", np.full(2400, -0.5, np.float32))  # same length, other audio
    with LineStore(tmp_path, "s", "test") as store:
        assert store.load(1, "A", marks[0]) is None and store.load(2, "A", marks[1]) is None
        np.testing.assert_array_equal(store.load(3, "A", marks[2]), clips[2])
        assert (store.altered, store.changed, store.unrecorded) == (2, 0, 0)


def test_files_written_but_never_recorded_are_counted_as_such(tmp_path):
    """A run stopped between writing a line and recording it: the rerun says so, not 'another text'."""
    marks = stored(tmp_path, [np.ones(100, np.float32)])
    LineFiles(tmp_path, "s", "test").write_line(2, "A", np.ones(100, np.float32))
    with LineStore(tmp_path, "s", "test") as store:
        assert store.load(1, "A", marks[0]) is not None and store.load(2, "A", "any") is None
        assert (store.unrecorded, store.changed, store.altered) == (1, 0, 0)


# -- one job at a time per folder and prefix ---------------------------------------------------------------------
def test_a_second_job_on_the_same_prefix_is_refused_while_the_first_holds_it(tmp_path):
    with LineStore(tmp_path, "scene/s", "first", what="cli.py render a.txt"):
        with pytest.raises(JobBusy, match=r"^second: another job is writing these files \(cli.py render a.txt, "
                                          rf"process {os.getpid()} on .+, since .+\); wait for it to finish, or give "
                                          r"this one another output folder or prefix$"):
            with LineStore(tmp_path, "scene/s", "second"):
                pass
        with LineStore(tmp_path, "scene/other", "third"):  # another prefix in the same folder is another job
            pass
    with LineStore(tmp_path, "scene/s", "second"):  # let go on leaving the block
        pass
    # the lock file goes with its holder, and the folder the job made with it, as nothing was written there
    assert not (tmp_path / "scene").exists()


def test_a_dead_jobs_lock_is_taken_over(tmp_path):
    """`kill -9` leaves the lock file; the operating system has let go of the lock, so the next job takes it."""
    held = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parents[3])!r})
        from morph.lines.store import LineStore
        LineStore({str(tmp_path)!r}, "s", "dead", what="a job that dies").__enter__()
        print("held", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)], stdout=subprocess.PIPE, text=True)
    assert held.stdout.readline().strip() == "held" and held.wait(30) == -signal.SIGKILL
    assert "a job that dies" in (tmp_path / ".s.lock").read_text()
    with LineStore(tmp_path, "s", "next"):
        assert str(os.getpid()) in (tmp_path / ".s.lock").read_text()


def test_the_store_refuses_use_outside_its_block(tmp_path):
    store = LineStore(tmp_path, "s", "test")
    with pytest.raises(RuntimeError, match="used outside its `with` block"):
        store.record([])


# -- writes: whole or not at all ----------------------------------------------------------------------------------
def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    """The second writer finishes while the first is mid-write: each file it leaves is one writer's whole."""
    path, first_started, second_done = tmp_path / "x.bin", threading.Event(), threading.Event()

    def slow(f):
        f.write(b"a" * 1000)
        first_started.set()
        second_done.wait(10)
        f.write(b"a" * 1000)

    first = threading.Thread(target=write_atomic, args=(path, slow, "first"))
    first.start()
    first_started.wait(10)
    write_atomic(path, lambda f: f.write(b"b" * 500), "second")
    assert path.read_bytes() == b"b" * 500
    second_done.set()
    first.join(10)
    assert path.read_bytes() == b"a" * 2000 and list(tmp_path.iterdir()) == [path]


def test_a_failed_manifest_write_keeps_the_last_one_whole(tmp_path, monkeypatch):
    marks = stored(tmp_path, [np.ones(100, np.float32)])
    before = (tmp_path / "s_lines.json").read_bytes()

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)  # the disk fills as the new manifest's last bytes go out
    with LineStore(tmp_path, "s", "test") as store:
        store.load(1, "A", marks[0])
        with pytest.raises(LineWriteError, match=rf"^test: could not write {re.escape(str(tmp_path / 's_lines.json'))}"
                                                 r": No space left on device; free some space on its disk$"):
            store.record([])
    assert (tmp_path / "s_lines.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.srt", "s_0001_A.wav", "s_lines.json"]  # no partial


def test_line_files_are_float_wavs_soundfile_reads_back_exactly(tmp_path):
    rng = np.random.default_rng(1)
    clip = rng.uniform(-1.5, 1.5, 12345).astype(np.float32)  # past full scale too: float WAV keeps it
    files = LineFiles(tmp_path, "s", "test")
    written = files.write_line(7, "Bob", clip)
    wav, rate = sf.read(files.path(7, "Bob"), dtype="float32")
    info = sf.info(str(files.path(7, "Bob")))
    assert rate == 24000 and info.subtype == "FLOAT" and info.channels == 1 and np.array_equal(wav, clip)
    assert written.samples == clip.size and written.file == "s_0007_Bob.wav"


def test_finish_removes_what_a_killed_writer_left_of_this_jobs_lines_only(tmp_path):
    """A distributed job's worker killed while writing a line leaves its temporary file; the line is written again
    by another worker, and the job's finish removes the leftover, not another prefix's or another file's."""
    wav = np.ones(100, np.float32)
    with LineStore(tmp_path, "s", "test") as store:
        written = store.write_line(1, "A", wav)
        store.record([(1, "A", "text", "mark", written)])
        left = tmp_path / f".{written.file}.4242-0a1b2c3d.part"
        others = [tmp_path / ".s2_0001_A.wav.4242-0a1b2c3d.part", tmp_path / f".{written.file}.keep"]
        for path in (left, *others):
            path.write_bytes(b"partial")
        store.finish(1, "")
    assert not left.exists() and all(p.exists() for p in others)
    assert sf.read(tmp_path / written.file)[0].size == 100


# -- what a fingerprint holds --------------------------------------------------------------------------------------
def test_a_fingerprint_changes_with_everything_that_decides_a_lines_audio_and_nothing_else():
    context = dict(model="tiny", settings={"seq_groups": 5})
    base = fingerprint(context, "Alice", "Hello.", voice())
    assert fingerprint(dict(reversed(list(context.items()))), "Alice", "Hello.", voice()) == base  # key order
    assert len({base, fingerprint(dict(context, model="other"), "Alice", "Hello.", voice()),
                fingerprint(context, "Bob", "Hello.", voice()), fingerprint(context, "Alice", "Hello!", voice()),
                fingerprint(context, "Alice", "Hello.", voice(1))}) == 5
    assert fingerprint(context, "Alice", "Hello.", voice(), speaker="ryan", instruct="loud") == base  # a voice's own
    spoken = fingerprint(context, "Alice", "Hello.", speaker="ryan", instruct="")
    assert len({spoken, fingerprint(context, "Alice", "Hello.", speaker="vivian", instruct=""),
                fingerprint(context, "Alice", "Hello.", speaker="ryan", instruct="loud"),
                fingerprint(context, "Alice", "Hello.", speaker=None, instruct="loud")}) == 4


def test_a_voice_digest_holds_its_embedding_codes_and_transcript():
    from morph.lines.store import voice_digest

    spk, code = torch.ones(8), torch.zeros((3, 16), dtype=torch.int64)
    digests = {voice_digest(Voice(spk, code, "Hi.", "0b6")), voice_digest(Voice(spk, code + 1, "Hi.", "0b6")),
               voice_digest(Voice(spk, code, "Hello.", "0b6")), voice_digest(Voice(spk, None, None, "0b6")),
               voice_digest(Voice(spk * 2, None, None, "0b6"))}
    assert len(digests) == 5


# -- the dialogue: in memory, in its subtitles and in its file ------------------------------------------------------
def test_three_clips_join_as_float32_with_a_pause_between_each_two():
    clips = [np.full(3, 0.5), np.full(2, -0.25), np.full(1, 1.0)]  # float64 in, float32 out
    joined, cues = join_clips(clips, 1 / 24000)
    assert joined.dtype == np.float32 and joined.tolist() == [0.5] * 3 + [0] + [-0.25] * 2 + [0] + [1.0]
    assert cues == [(0, 3 / 24000), (4 / 24000, 6 / 24000), (7 / 24000, 8 / 24000)]
    empty, none = join_clips([], 0.5)
    assert empty.dtype == np.float32 and empty.size == 0 and none == []


def test_subtitles_time_hours_minutes_and_milliseconds():
    assert srt([(59.9994, 60.0, "A", "one"), (3599.9996, 3661.001, "B", "two")]) == (
        "1\n00:00:59,999 --> 00:01:00,000\nA: one\n\n2\n01:00:00,000 --> 01:01:01,001\nB: two\n")


def test_the_dialogues_header_claims_exactly_its_samples(tmp_path):
    from morph.lines.files import wav_header

    files = LineFiles(tmp_path, "s", "test")
    files.write_line(1, "A", np.ones(10, np.float32))
    one = files.join_lines(["A"], 0.5).read_bytes()  # one line: no pause
    assert one == wav_header(10) + np.ones(10, "<f4").tobytes()
    files.write_line(2, "B", np.full(5, -1, np.float32))
    two = files.join_lines(["A", "B"], 1 / 24000).read_bytes()
    assert two == wav_header(16) + np.array([1] * 10 + [0] + [-1] * 5, "<f4").tobytes()


def test_a_line_file_that_changes_while_the_dialogue_is_joined_stops_the_join(tmp_path, monkeypatch):
    files = LineFiles(tmp_path, "s", "test")
    files.write_line(1, "A", np.ones(10, np.float32))
    info = sf.info
    monkeypatch.setattr(sf, "info", lambda path: type("Info", (), {"frames": info(path).frames - 1}))
    with pytest.raises(RuntimeError, match=rf"^test: {re.escape(str(files.path(1, 'A')))} changed while the dialogue "
                                           "was joined from it$"):
        files.join_lines(["A"], 0.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s_0001_A.wav"]


def test_each_file_a_rerun_finds_unrecorded_is_counted(tmp_path):
    files = LineFiles(tmp_path, "s", "test")
    for i in (1, 2):
        files.write_line(i, "A", np.ones(10, np.float32))
    with LineStore(tmp_path, "s", "test") as store:
        assert store.load(1, "A", "x") is None and store.load(2, "A", "x") is None and store.unrecorded == 2
