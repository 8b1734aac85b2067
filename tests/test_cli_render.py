"""`cli.py render`: a whole script into a folder, on the tiny models (CPU), for the three model kinds; resume; Ctrl-C
keeps what is done; every bad input refused before the model loads, in the CLI's words."""

import json
import logging
import re
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

import cli
import cli_render
from tests.test_cli import NODE_WORDS, ROOT, fails, speech

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


def test_each_note_is_said_once_the_attention_kernel_and_the_lines_reused(tiny_dir, tmp_path, cast, capsys, caplog):
    """A render works out its fingerprints' context (the attention kernel among it) and then loads: the kernel is
    logged by the load alone. A rerun's reused lines are said by the job's one status line, not again by the CLI."""
    caplog.set_level(logging.INFO)
    argv = ["render", str(tmp_path / "scene.txt"), *options(tiny_dir, tmp_path / "r", *cast)]
    assert cli.main(argv) == 0
    assert [r.getMessage() for r in caplog.records].count("Qwen3-TTS attention: sdpa") == 1
    (tmp_path / "scene.txt").write_text(SCRIPT.replace("Fine, thanks.", "Fine, thank you."), encoding="utf-8")
    caplog.clear()
    capsys.readouterr()
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err + caplog.text
    assert said.count("2 of 3 lines already rendered in") == 1 and "already in" not in said, said
    assert "rendering 1 of 3 lines on cpu" in captured.err


def load_in_mode(mode: str, monkeypatch) -> None:
    """cli.py render's model loaded in `mode`."""
    load = cli_render.load_model

    def loaded(args):
        tts = load(args)
        tts.patch.mode = mode
        return tts

    monkeypatch.setattr(cli_render, "load_model", loaded)


@pytest.mark.parametrize("mode, said", [("lean", "in a continuous batch"), ("auto", "in static batches")])
def test_a_render_runs_as_its_speed_mode_does(mode, said, tiny_dir, tmp_path, cast, capsys, monkeypatch):
    """Every mode but eager (the CPU's default) renders in the continuous batch; eager in static batches."""
    load_in_mode(mode, monkeypatch)
    out = tmp_path / "renders"
    assert cli.main(["render", str(tmp_path / "scene.txt"), *options(tiny_dir, out, *cast)]) == 0
    assert f"rendering 3 of 3 lines on cpu, 64 at a time {said}" in capsys.readouterr().err
    assert len(list(out.glob("dialogue_*.wav"))) == 3


@pytest.mark.parametrize("mode", ["lean", "auto"])
def test_a_seeded_lines_take_and_the_batch_size_are_as_the_seed_help_says(mode, tiny_dir, tmp_path, cast, capsys,
                                                                          monkeypatch):
    """The same seed and --batch-size give the same take; another --batch-size changes a take in eager mode (auto on
    the CPU: one random stream a batch) and none in a continuous mode in fp32 (the CPU's dtype: each line its own
    stream), up to the codec's rounding."""
    load_in_mode(mode, monkeypatch)

    def takes(batch_size: int, out: str) -> list[np.ndarray]:
        argv = ["render", str(tmp_path / "scene.txt"), *cast, "--model", str(tiny_dir), "--device", "cpu", "--seed",
                "5", "--max-new-tokens", "6", "--no-smooth", "--out", str(tmp_path / out), "--batch-size",
                str(batch_size)]
        assert cli.main(argv) == 0, capsys.readouterr().err
        return [sf.read(f)[0] for f in sorted((tmp_path / out).glob("dialogue_000*.wav"))]

    three, again, one = takes(3, "a"), takes(3, "b"), takes(1, "c")
    assert all(np.array_equal(x, y) for x, y in zip(three, again, strict=True))

    def same(x, y):
        return x.shape == y.shape and np.abs(x - y).max() < 1e-3

    kept = [same(x, y) for x, y in zip(three, one, strict=True)]
    assert all(kept) if mode == "lean" else not all(kept), kept
    assert "random seed: the same seed, script and --batch-size give the same take on one machine; another batch " \
           "size can change it in bf16 (GPUs) and eager mode (the CPU)" in \
        " ".join(cli_render.build_parser().format_help().split())


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_the_retired_batching_option_still_runs_and_static_says_it_is_retired(batching, tiny_dir, tmp_path, cast,
                                                                              capsys, caplog):
    """--batching is taken for one release so that scripts that pass it run; it changes nothing."""
    out = tmp_path / "renders"
    argv = ["render", str(tmp_path / "scene.txt"), *options(tiny_dir, out, *cast, "--batching", batching)]
    with caplog.at_level("WARNING", logger="morph.render"):
        assert cli.main(argv) == 0
    assert "64 at a time in static batches" in capsys.readouterr().err
    retired = [r.getMessage() for r in caplog.records if "retired" in r.getMessage()]
    assert retired == ([] if batching == "continuous" else [
        "--batching: batching 'static' is retired and goes in the next release: every speed mode but eager renders "
        "in the continuous batch, and eager (the exact reference) in static batches; this render runs as its speed "
        "mode does"])


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
    (["--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--transcript", "Carol=Hi."], "--transcript: Carol has no --voice"),
    (["--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--seq-groups", "0"], "--seq-groups must be an integer"),
    (["--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--prefix", "../up"], "--prefix '../up' must be a relative name"),
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
    from morph.script_job import job_context
    from morph.settings import GenerationSettings

    (tmp_path / "s.txt").write_text(SCRIPT, encoding="utf-8")
    args = cli_render.build_parser().parse_args([str(tmp_path / "s.txt"), *options(tiny_dir, tmp_path / "r")])
    settings = GenerationSettings(top_k=7)
    with cli_render.Renderer(args) as renderer:
        before = renderer.context("English", settings, True)
        assert renderer.tts is None  # nothing loaded for it
        assert before == job_context(renderer().config, "English", settings, True)


# -- issue 37: progress a log can read, help, the command typed, ranges, folders -------------------------------
def test_progress_in_a_log_counts_the_lines_and_ends_with_the_final_counts(tiny_dir, tmp_path, cast, capsys):
    """stderr is not a terminal here (pytest captures it): plain lines, no carriage returns, and the last one
    says every line is done."""
    assert cli.main(["render", str(tmp_path / "scene.txt"), *options(tiny_dir, tmp_path / "r", *cast)]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    reports = [line for line in err.splitlines() if " of 3 lines | " in line]
    assert reports[0].startswith("[") and reports[-1].startswith("[" + "#" * 24 + "] 3 of 3 lines | ")
    assert re.search(r" \| took \d+:\d\d$", reports[-1]), reports[-1]
    done = [int(line.split("] ")[1].split(" of ")[0]) for line in reports]
    assert done == sorted(done), "lines done only go up"


class _Clock:
    def __init__(self, monkeypatch):
        from types import SimpleNamespace

        import morph.progress

        self.now = 0.0
        monkeypatch.setattr(morph.progress, "time", SimpleNamespace(perf_counter=lambda: self.now))


class _Stream:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_a_log_gets_a_line_at_each_batch_of_lines_and_every_few_seconds(monkeypatch):
    clock, log = _Clock(monkeypatch), _Stream(tty=False)
    progress = cli_render.ScriptProgress(4, log)
    for frame in range(120):  # 12 s of frames; a batch of two lines ends at 3 s
        clock.now = frame / 10
        if frame == 30:
            progress.line(0, np.zeros(24000))
            progress.line(1, np.zeros(48000))
        progress.step(frame, 240)
    progress.lines_done([(2, 24000), (3, 24000)])  # a worker's batch: reported as it comes
    progress.finish()
    lines = log.text.splitlines()
    assert [line.split("] ")[1].split(" |")[0] for line in lines] == \
        ["0 of 4 lines", "2 of 4 lines", "2 of 4 lines", "4 of 4 lines", "4 of 4 lines"]
    # at 0 s, the batch at 3 s, 5 s after it, the workers' batch, the end
    assert "3.0 s of audio" in lines[1] and lines[-1].endswith("took 0:12")


def test_a_terminal_bar_redraws_its_final_counts(monkeypatch):
    clock, tty = _Clock(monkeypatch), _Stream(tty=True)
    progress = cli_render.ScriptProgress(2, tty)
    progress.step(1, 10)
    clock.now = 0.05  # within a tenth of a second: not redrawn
    progress.line(0, np.zeros(24000))
    progress.line(1, np.zeros(24000))
    progress.step(10, 10)
    progress.finish()
    draws = tty.text.split("\r")[1:]
    assert len(draws) == 2 and draws[0].split("] ")[1].startswith("0 of 2 lines")
    assert draws[-1].startswith("[" + "#" * 24 + "] 2 of 2 lines") and draws[-1].endswith("took 0:00  \n")


def test_help_states_each_default_once_and_the_render_help_shows_its_examples(capsys):
    for argv in (["speak", "--help-all"], ["render", "--help-all"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert not any(f"(default: {v})" in text for v in ("None", "False", "[]")), argv
        assert "default: 5 s plus 0.35 s per character" in text and "(default: 0.9)" in text
    assert "python cli.py render scene1.txt --voice Alice=alice.wav" in text
    assert "--voice Bob=bob.safetensors" in text
    assert "--batching" not in text  # retired: still taken, no longer offered


@pytest.mark.parametrize("argv, answer", [
    (["rendr", "x.txt"], "error: unknown command 'rendr'; did you mean render? (render a script: a WAV per line, "
                         "the dialogue, subtitles: python cli.py render scene1.txt"),
    (["voices", "save"], "error: unknown command 'voices'; did you mean voice?"),
    (["hello.txt"], "error: unknown command 'hello.txt'; the commands are speak, render, voice, serve: python cli.py "
                    "--help"),
])
def test_a_mistyped_command_gets_the_command_meant(argv, answer, capsys, no_load):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(answer)


@pytest.mark.parametrize("flag, value, message", [
    ("--batch-size", "0", "--batch-size must be 1 or more, got 0"),
    ("--pause", "-1", "--pause must be from 0 to 600 seconds, got -1"),
    ("--pause", "601.5", "--pause must be from 0 to 600 seconds, got 601.5"),
    ("--gpus", "0", "--gpus must be 1 or more (the number of GPUs to render over), got 0"),
])
def test_each_range_error_names_its_option_and_the_value_given(flag, value, message, tmp_path, capsys, no_load,
                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    sf.write("a.wav", speech(2.0), 24000)
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    err = fails(["render", "scene.txt", "--voice", "Alice=a.wav", "--voice", "Bob=a.wav", flag, value], capsys)
    assert err == f"error: {message}\n"


def test_a_run_that_fails_before_its_first_line_leaves_no_folder(tiny_dir, tmp_path, capsys, no_load, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sf.write("a.wav", speech(2.0), 24000)
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    with pytest.raises(AssertionError, match="loaded before"):  # the load fails once the job holds its folder
        cli.main(["render", "scene.txt", "--voice", "Alice=a.wav", "--voice", "Bob=a.wav", "--out", "new/renders",
                  "--model", str(tiny_dir)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "scene.txt"]


def test_clips_are_refused_before_torch_loads(tmp_path):
    """A short or silent clip is refused at once, not after torch's import (seconds on a busy machine); a saved
    voice in the same cast does not pull torch in first."""
    sf.write(tmp_path / "quiet.wav", np.zeros(48000, np.float32), 24000)
    sf.write(tmp_path / "short.wav", speech(0.3), 24000)
    (tmp_path / "scene.txt").write_text(SCRIPT, encoding="utf-8")
    (tmp_path / "bob.safetensors").write_bytes(b"not read before the clips")
    runs = {"cli.py": "['--text', 'Hi', '--voice', 'quiet.wav']",
            "render": "['render', 'scene.txt', '--voice', 'Alice=short.wav', '--voice', 'Bob=bob.safetensors']"}
    for name, argv in runs.items():
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import cli; rc = cli.main({argv}); " \
               "print(rc, 'torch' in sys.modules)"
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.stdout.split() == ["2", "False"], (name, run.stdout, run.stderr)
        assert "the clip is silent" in run.stderr or "the clip is 0.30 s long" in run.stderr


def test_the_engine_is_made_ready_for_the_batch_size_before_the_first_line(tiny_dir, tmp_path, cast, capsys,
                                                                           monkeypatch):
    """render loads the model and gets its engine ready for --batch-size rows (MorphTTS.ready: compiled and captured
    before the first line, said in the log), once, before any line is rendered."""
    from morph.api import MorphTTS

    calls, rendered = [], []
    monkeypatch.setattr(MorphTTS, "ready", lambda self, width=64, who="": calls.append((width, who, len(rendered))))
    real = MorphTTS.voice_from_clip
    monkeypatch.setattr(MorphTTS, "voice_from_clip", lambda self, *a, **k: rendered.append("voice") or real(self, *a, **k))
    out = tmp_path / "renders"
    assert cli.main(["render", str(tmp_path / "scene.txt"), *options(tiny_dir, out, *cast, "--batch-size", "3")]) == 0
    assert calls == [(3, "cli.py render", 0)]
