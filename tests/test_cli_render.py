"""`cli.py render`: a whole script into a folder, on the tiny models (CPU), for the three model kinds; resume; Ctrl-C
keeps what is done; every bad input refused before the model loads, in the CLI's words."""

import json

import numpy as np
import pytest
import soundfile as sf

import cli
import cli_render
from tests.test_cli import NODE_WORDS, fails, speech

SCRIPT = "# scene one\nAlice: Hello there, Bob.\nBob: Hi Alice! How are you?\nAlice: Fine, thanks.\n"


def options(model, out, *more):
    return ["--model", str(model), "--device", "cpu", "--greedy", "--max-new-tokens", "6", "--out", str(out), *more]


@pytest.fixture
def cast(tmp_path, tiny_tts):
    """Alice from a clip with its transcript, Bob from a saved voice."""
    from morph.lines.voice import save_voice

    sf.write(tmp_path / "alice.wav", speech(2.0, 22050, channels=2), 22050)
    save_voice(tiny_tts.make_voice(speech(2.0), 24000), tmp_path / "bob.safetensors")
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    return ["--voice", f"Alice={tmp_path / 'alice.wav'}", "--transcript", "alice=A short reference sentence.",
            "--voice", f"bob={tmp_path / 'bob.safetensors'}"]


def test_a_script_renders_every_file_and_a_rerun_renders_only_what_changed(tiny_dir, tmp_path, cast, capsys):
    out = tmp_path / "renders"
    assert cli.main(["render", str(tmp_path / "scene.txt"), *options(tiny_dir, out, *cast, "--prefix", "s1")]) == 0
    captured = capsys.readouterr()
    names = ["s1_0001_Alice.wav", "s1_0002_bob.wav", "s1_0003_Alice.wav"]  # as the options spell the names
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["s1.wav", "s1.srt", "s1_lines.json"])
    for name in names:
        audio, rate = sf.read(out / name)
        assert rate == 24000 and audio.ndim == 1 and audio.size > 0
    assert "bob: Hi Alice! How are you?" in (out / "s1.srt").read_text()
    assert list(json.loads((out / "s1_lines.json").read_text())["lines"]) == ["0001", "0002", "0003"]
    assert "3 of 3 lines" in captured.err and "wrote 3 lines (0 reused)" in captured.out
    first = {name: sf.read(out / name)[0] for name in names}

    (tmp_path / "scene.txt").write_text(SCRIPT.replace("Fine, thanks.", "Fine, thank you."), encoding="utf-8")
    assert cli.main(["render", str(tmp_path / "scene.txt"), *options(tiny_dir, out, *cast, "--prefix", "s1")]) == 0
    captured = capsys.readouterr()
    assert "rendering 1 of 3 lines" in captured.err and "wrote 3 lines (2 reused)" in captured.out
    for name in names[:2]:
        np.testing.assert_array_equal(sf.read(out / name)[0], first[name])


@pytest.mark.parametrize("variant, flags", [
    ("custom_voice", ["--speaker", "Alice=Vivian", "--speaker", "Bob=ryan", "--instruct", "Bob=Cheerful."]),
    ("voice_design", ["--design", "Alice=A warm, low voice.", "--design", "Bob=A bright young voice."])])
def test_speakers_and_designed_voices_render_a_script(variant, flags, model_dirs, tmp_path, capsys):
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    out = tmp_path / variant
    assert cli.main(["render", str(tmp_path / "scene.txt"), *options(model_dirs("tiny", variant), out, *flags)]) == 0
    assert len(list(out.glob("dialogue_000*.wav"))) == 3 and (out / "dialogue.srt").is_file()


def test_ctrl_c_keeps_the_finished_lines_and_the_same_command_renders_the_rest(tiny_dir, tmp_path, cast, capsys,
                                                                               monkeypatch):
    line = cli_render.ScriptProgress.line

    def interrupt_after_the_first(self, index, wav):
        line(self, index, wav)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_render.ScriptProgress, "line", interrupt_after_the_first)
    argv = ["render", str(tmp_path / "scene.txt"), *options(tiny_dir, tmp_path / "r", *cast, "--batch-size", "1")]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("interrupted: 1 of 3 lines are in ") and "Traceback" not in err
    assert len(list((tmp_path / "r").glob("dialogue_000*.wav"))) == 1
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert "rendering 2 of 3 lines" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--voice", "Alice=a.wav"], "unknown character 'Bob'. Known characters: Alice; fix the spelling or give the "
                                 "missing character a --voice, --speaker or --design"),
    (["--voice", "Alice=a.wav", "--voice", "Bob=missing.wav"], "--voice: file not found: missing.wav"),
    (["--voice", "Alice=a.wav", "--speaker", "Bob=Vivian"], "--voice and --speaker need different models"),
    (["--voice", "Alice", "--voice", "Bob=a.wav"], "--voice 'Alice': write it as --voice NAME=VALUE"),
    (["--voice", "Alice=a.wav", "--voice", "alice=a.wav"], "--voice: 'alice' is given twice"),
    (["--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--transcript", "Carol=Hi."], "--transcript: carol has no --voice"),
    (["--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--seq-groups", "0"], "--seq-groups must be an integer"),
    (["--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--prefix", "../up"], "--prefix: filename_prefix"),
    ([], "give each character of the script a voice"),
])
def test_bad_input_is_refused_before_loading(flags, message, tmp_path, capsys, no_load, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sf.write("a.wav", speech(2.0), 24000)
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    err = fails(["render", "scene.txt", "--out", str(tmp_path / "o"), *flags], capsys)
    assert err.startswith("error: ") and message in err, err
    assert not any(word in err for word in NODE_WORDS), err


def test_an_unwritable_folder_and_a_silent_clip_are_refused_before_loading(tmp_path, capsys, no_load, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sf.write("a.wav", speech(2.0), 24000)
    sf.write("quiet.wav", np.zeros(48000, np.float32), 24000)
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    if (tmp_path / "/proc/self").exists():
        err = fails(["render", "scene.txt", "--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--out", "/proc/x"], capsys)
        assert err.startswith("error: --out: cannot write into /proc/x (")
    err = fails(["render", "scene.txt", "--voice", "Alice=a.wav", "--voice", "Bob=quiet.wav"], capsys)
    assert "--voice Bob=quiet.wav: the clip is silent; give Bob another recording" in err


def test_a_transcript_for_a_clip_over_30_s_is_refused_before_loading(tmp_path, capsys, no_load, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sf.write("a.wav", speech(2.0), 24000)
    sf.write("long.wav", speech(31.0, 16000), 16000)
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    err = fails(["render", "scene.txt", "--voice", "Alice=a.wav", "--voice", "Bob=long.wav", "--transcript",
                 "Bob=All of it."], capsys)
    assert err.startswith("error: --voice Bob=long.wav: the clip is 31.0 s long, and only its first 30 s can be used")
    assert "or leave out --transcript Bob=... to clone from the first 30 s" in err


def test_a_second_job_on_the_same_out_and_prefix_is_refused_and_every_line_is_what_its_record_says(
        tiny_dir, tmp_path, cast):
    """Two `cli.py render` processes on one --out and --prefix with other settings: the second is refused before it
    loads anything, naming the first; the first's files are each what its manifest entry records."""
    import hashlib
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    (tmp_path / "long.txt").write_text("".join(f"Alice: Line {i}, said slowly.\n" for i in range(12)), encoding="utf-8")
    out, root = tmp_path / "r", Path(cli.__file__).parent
    command = [sys.executable, "cli.py", "render", str(tmp_path / "long.txt"), *options(tiny_dir, out, *cast[:4])]
    first = subprocess.Popen(command + ["--batch-size", "2", "--max-new-tokens", "8"], cwd=root,
                             stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # the lock is taken before the model loads
            if (out / ".dialogue.lock").is_file() and str(first.pid) in (out / ".dialogue.lock").read_text():
                break
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGSTOP)  # held mid-job, however fast this machine is
        second = subprocess.run(command + ["--max-new-tokens", "4"], cwd=root, capture_output=True, text=True,
                                timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2, second.stderr
    assert (f"error: cli.py render: another job is writing these files (cli.py render {tmp_path / 'long.txt'}, "
            f"process {first.pid} on ") in second.stderr and "loading" not in second.stderr
    assert first.wait(300) == 0, first.stderr.read()
    entries = json.loads((out / "dialogue_lines.json").read_text())["lines"].values()
    assert len(entries) == 12
    for entry in entries:
        data = (out / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert sf.info(str(out / entry["file"])).frames == entry["samples"]
    assert not list(out.glob("*.part")) and not (out / ".dialogue.lock").exists()


def test_the_context_known_before_a_load_is_the_loaded_models(tiny_dir, tmp_path):
    """A rerun with every line in --out fingerprints them without loading: with the context a load would give, or
    a changed line would be missed (or every line rendered again)."""
    from morph.script_job import render_context
    from morph.settings import GenerationSettings

    (tmp_path / "s.txt").write_text(SCRIPT, encoding="utf-8")
    args = cli_render.build_parser().parse_args([str(tmp_path / "s.txt"), *options(tiny_dir, tmp_path / "r")])
    settings = GenerationSettings(top_k=7)
    with cli_render.Engine(args) as engine:
        before = engine.context("English", settings, True)
        assert engine.tts is None  # nothing loaded for it
        assert before == render_context(engine(), engine().device.type, "English", settings, True)
