"""The README's main job (cli.py), end to end on a tiny model, and each of its input checks."""

import argparse
import contextlib
import dataclasses
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import cli
import cli_common
import cli_render
import cli_serve
import cli_voice
from tests.clips import clip_names, write_clip

ROOT = Path(__file__).resolve().parents[1]
ALARMING = ("[ERROR]", "ERROR", "Traceback", "WARNING", "Warning", "warn(", "deprecated", "flash-attn", "SoX",
            "sox", "Loading weights", "it/s]")
NODE_WORDS = ("connect", "x_vector_only", "node")


def speech(seconds, rate=24000, channels=1):
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return np.stack([wave, 0.5 * wave], axis=1) if channels == 2 else wave  # soundfile's [T, C]


def quick(*args, model):
    return ["--model", str(model), "--device", "cpu", "--seed", "3", "--max-new-tokens", "10", *args]


def test_cli_writes_a_24k_wav_with_the_default_voice_and_shows_progress(tiny_dir, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "hello"  # no extension, in a folder that does not exist
    code = cli.main(["--text", "Hello from the command line.", "--out", str(out), *quick(model=tiny_dir)])
    assert code == 0
    audio, sr = sf.read(tmp_path / "new" / "folder" / "hello.wav")
    assert sr == 24000 and audio.ndim == 1 and audio.size > 0
    assert abs(abs(audio).max() - 10 ** (-3 / 20)) < 1e-3  # smoothed and normalised to -3 dBFS
    captured = capsys.readouterr()
    assert "x real time" in captured.out
    assert re.search(r"frame 1 of at most \d+ \| 1 segment \| .* frames/s", captured.err)


def test_a_stereo_voice_file_clones(tiny_dir, tmp_path, capsys):
    voice = tmp_path / "me.wav"
    sf.write(voice, speech(2.0, 44100, channels=2), 44100)
    out = tmp_path / "me_speaking.flac"
    code = cli.main(["--text", "Hi.", "--voice", str(voice), "--transcript", "Hello there.", "--out", str(out),
                     *quick(model=tiny_dir)])
    assert code == 0, capsys.readouterr().err
    assert sf.info(str(out)).format == "FLAC"


def fails(argv, capsys) -> str:
    assert cli.main(argv) == 2
    return capsys.readouterr().err


def test_a_missing_voice_file_says_file_not_found(tmp_path, capsys, no_load):
    err = fails(["--text", "Hi", "--voice", str(tmp_path / "missing.wav")], capsys)
    assert err == f"error: --voice: file not found: {tmp_path / 'missing.wav'}\n"


def test_a_voice_file_that_is_not_audio_is_refused(tmp_path, capsys, no_load):
    (tmp_path / "notes.wav").write_text("not audio")
    assert "error: --voice: cannot read" in fails(["--text", "Hi", "--voice", str(tmp_path / "notes.wav")], capsys)


@pytest.mark.parametrize("option, value, message", [
    ("--seq-groups", "20", "error: --seq-groups must be an integer from 1 to 15, got 20"),
    ("--language", "Klingon", "--language 'Klingon' is not one of Auto, Chinese, English"),
    ("--temperature", "0", "error: --temperature must be > 0"),
    ("--top-p", "1.5", "error: --top-p must be in (0, 1]"),
    ("--max-new-tokens", "0", "error: --max-new-tokens must be >= 1, got 0; leave it out"),
    ("--seed", "-1", "--seed must be >= 0"),
    ("--text", "   ", "--text is empty"),
    ("--out", "speech.mp4", "--out: cannot write .mp4 files; use .wav"),
])
def test_bad_options_are_refused_before_loading(option, value, message, capsys, no_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--text", "Hi", option, value] if option != "--text" else ["--text", value]
    err = fails(argv, capsys)
    assert message in err
    assert not any(word in err for word in NODE_WORDS + ("cli.py", "seq_groups", "top_p", "max_new_tokens")), err


def test_an_output_folder_that_cannot_be_made_is_refused_before_loading(tmp_path, capsys, no_load):
    (tmp_path / "file").write_text("")
    err = fails(["--text", "Hi", "--out", str(tmp_path / "file" / "out.wav")], capsys)
    assert f"error: --out: cannot create the folder {tmp_path / 'file'}" in err
    assert fails(["--text", "Hi", "--out", str(tmp_path)], capsys).startswith(f"error: --out: {tmp_path} is a folder")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nobody may create a file")
def test_an_output_place_nobody_can_write_is_refused_before_loading(capsys, no_load):
    # /proc refuses new files even to root, whom the mode bits (os.access) let through
    err = fails(["--text", "Hi", "--out", "/proc/x.wav"], capsys)
    assert err.startswith("error: --out: cannot write /proc/x.wav (") and "choose another place" in err
    assert not Path("/proc/x.wav").exists()


def test_checking_the_output_leaves_no_file_and_keeps_an_existing_one(tmp_path):
    assert cli_common.check_output(tmp_path / "new.wav") == tmp_path / "new.wav" and not (tmp_path / "new.wav").exists()
    (tmp_path / "old.wav").write_bytes(b"take one")
    cli_common.check_output(tmp_path / "old.wav")
    assert (tmp_path / "old.wav").read_bytes() == b"take one"


def test_an_output_path_is_checked_but_its_folder_made_only_with_the_file(tmp_path, capsys, no_load):
    with pytest.raises(AssertionError, match="loaded before"):  # every check passed, then the load
        cli.main(["--text", "Hi", "--out", str(tmp_path / "a" / "b" / "take1")])
    assert list(tmp_path.iterdir()) == []  # a run that stops before writing leaves no empty folder
    assert cli_common.check_output(tmp_path / "take1") == tmp_path / "take1.wav"


def test_a_transcript_for_a_clip_over_30_s_is_refused_before_loading(tmp_path, capsys, no_load):
    sf.write(tmp_path / "long.wav", speech(31.0, 16000), 16000)
    err = fails(["--text", "Hi", "--voice", str(tmp_path / "long.wav"), "--transcript", "All of it."], capsys)
    assert err.startswith("error: --voice long.wav: the clip is 31.0 s long, and only its first 30 s can be used")
    assert "or leave out --transcript to clone from the first 30 s" in err
    assert not any(word in err for word in NODE_WORDS), err


def test_a_silent_clip_is_refused_before_loading_in_the_clis_words(tmp_path, capsys, no_load):
    sf.write(tmp_path / "quiet.wav", np.zeros(48000, np.float32), 24000)
    err = fails(["--text", "Hi", "--voice", str(tmp_path / "quiet.wav")], capsys)
    assert err == "error: --voice quiet.wav: the clip is silent; give --voice a recording of the voice to clone\n"


def test_a_device_this_machine_lacks_is_refused_before_loading(capsys, no_load, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "error: device 'cuda' is not available" in fails(["--text", "Hi", "--device", "cuda"], capsys)


def test_help_comes_up_at_once_with_defaults_and_a_line_for_every_option():
    """At once: --help and the argument checks import none of the heavy modules (the probe below)."""
    run = subprocess.run([sys.executable, "cli.py", "speak", "--help-all"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "(default: 5)" in run.stdout and "(default: Qwen/Qwen3-TTS-12Hz-0.6B-Base)" in run.stdout
    undocumented = [a.dest for a in cli.build_parser()._actions if not a.help]
    assert undocumented == []
    probe = subprocess.run([sys.executable, "-c", "import sys, cli; cli.build_parser(); print(sorted("
                            "m for m in ('torch', 'numpy', 'transformers', 'qwen_tts') if m in sys.modules))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "[]", probe.stderr


def test_the_cli_defaults_are_the_engines():
    from morph.settings import GenerationSettings

    args, engine = cli.parse_args(["--text", "Hi"]), GenerationSettings()
    assert (args.seq_groups, args.temperature, args.top_k, args.top_p, args.repetition_penalty) == (
        engine.seq_groups, engine.temperature, engine.top_k, engine.top_p, engine.repetition_penalty)
    assert cli_common.DEFAULT_MODELS_DIR == ROOT / "models" / "qwen3-tts"


def test_what_the_cli_writes_by_default_goes_under_one_folder_the_clone_ignores():
    """The spoken line, the script's folder and the server's voices: in the working folder's output/, which the
    clone's .gitignore lists, so a newcomer's first runs leave nothing untracked in it; the overview says so."""
    out = cli_common.OUTPUT_DIR
    defaults = [cli.parse_args(["--text", "Hi"]).out, cli_render.build_parser().parse_args(["s.txt"]).out,
                cli_serve.build_parser().parse_args([]).voices]
    assert defaults == [out / "out.wav", out / "renders", out / "voices"] and not out.is_absolute()
    assert f"/{out}/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert f"What a command writes by default goes under {out}/ in the working folder." in \
        " ".join(cli.overview().split())


def test_a_successful_run_prints_nothing_alarming(tiny_dir, tmp_path):
    run = subprocess.run([sys.executable, "cli.py", "--text", "Hello.", "--out", str(tmp_path / "o.wav"),
                          *quick(model=tiny_dir)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    found = [word for word in ALARMING if word in run.stdout + run.stderr]
    assert found == [], run.stdout + run.stderr


def test_offline_without_a_local_copy_says_where_to_put_which_files(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    run = subprocess.run([sys.executable, str(ROOT / "cli.py"), "--text", "Hi", "--models-dir", "models-here"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    target = tmp_path / "models-here" / "Qwen3-TTS-12Hz-0.6B-Base"  # named absolutely
    assert f"put the checkpoint's files into {target}: config.json, generation_config.json" in run.stderr
    assert f"hf download Qwen/Qwen3-TTS-12Hz-0.6B-Base --local-dir {target}" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("name", clip_names())
def test_every_common_clip_file_clones(name, tiny_dir, tmp_path, capsys, caplog):
    """A newcomer's own clip, as a recorder or espeak-ng writes it."""
    caplog.set_level(logging.INFO)
    voice = write_clip(name, tmp_path)
    code = cli.main(["--text", "Hi.", "--voice", str(voice), "--transcript", "Hello there.",
                     "--out", str(tmp_path / "o.wav"), *quick(model=tiny_dir)])
    captured = capsys.readouterr()
    said = captured.out + captured.err + caplog.text  # main's log lines go to pytest's handler here
    assert code == 0, said
    assert "silent" not in said and "int16" not in said
    assert "[WARNING]" not in said  # qwen-tts's note on samples past full scale: none reach it
    assert ("scaled down to peak at 1.0" in said) == (abs(sf.read(voice)[0]).max() > 1.0), said
    assert sf.read(tmp_path / "o.wav")[0].size > 0


@pytest.fixture
def never_ending(monkeypatch):
    """Random weights end their speech at random frames; here they never do, so every frame limit is reached."""
    settings_from = cli.settings_from
    monkeypatch.setattr(cli, "settings_from", lambda args: dataclasses.replace(
        settings_from(args), min_new_tokens=10_000))  # end of speech held back past any limit


def test_max_new_tokens_is_the_number_of_frames(tiny_dir, tmp_path, capsys, never_ending):
    """--max-new-tokens 7 gives 7 frames (80 ms each)."""
    sf.write(tmp_path / "me.wav", speech(2.0), 24000)
    out = tmp_path / "o.wav"
    assert cli.main(["--text", "Hi.", "--voice", str(tmp_path / "me.wav"), "--out", str(out), "--no-smooth",
                     "--model", str(tiny_dir), "--device", "cpu", "--seed", "3", "--max-new-tokens", "7"]) == 0
    assert sf.read(out)[0].size == 7 * 1920
    assert "frame 7 of at most 7" in capsys.readouterr().err


def test_the_models_dir_defaults_to_the_environment_variable(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cli_common.MODELS_DIR_ENV, raising=False)
    assert cli.parse_args(["--text", "Hi"]).models_dir == cli_common.DEFAULT_MODELS_DIR
    mine = tmp_path / "my-models"
    (mine / "tiny").mkdir(parents=True)
    for item in Path(tiny_dir).iterdir():
        (mine / "tiny" / item.name).symlink_to(item)
    monkeypatch.setenv(cli_common.MODELS_DIR_ENV, str(mine))
    assert cli.parse_args(["--text", "Hi"]).models_dir == mine
    assert f"default: ${cli_common.MODELS_DIR_ENV}, else models/qwen3-tts" in \
        " ".join(cli.build_parser().format_help(everything=True).split())
    args = ["--text", "Hi.", "--out", str(tmp_path / "o.wav"), *quick(model="tiny")]  # a folder name in it
    assert cli.main(args) == 0, capsys.readouterr().err


def test_ctrl_c_ends_with_one_line_and_writes_nothing(tiny_dir, tmp_path, capsys, monkeypatch, never_ending):
    def interrupt(self, step, total):
        if step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_common.Progress, "__call__", interrupt)
    out = tmp_path / "o.wav"
    assert cli.main(["--text", "Hello there, how are you?", "--out", str(out), *quick(model=tiny_dir)]) == 130
    err = capsys.readouterr().err
    assert err.endswith("\ninterrupted\n") and "Traceback" not in err, err
    assert not out.exists()


def test_a_model_that_cannot_clone_is_refused_in_the_clis_words(model_dirs, capsys):
    model = model_dirs("tiny", "custom_voice")
    err = fails(["--text", "Hi", "--model", str(model), "--device", "cpu"], capsys)
    assert f"error: --model: {model} is a CustomVoice model; cloning a voice needs a Base model" in err
    assert not any(word in err for word in NODE_WORDS), err


# -- issue 60: the commands listed, help that fits a screen, typos answered, the model checked first, saved voices --
def cli_run(*argv, cwd=ROOT, timeout=120):
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, COLUMNS="80"))


def test_help_lists_every_command_with_a_line_and_an_example():
    run = cli_run("--help")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    for command in ("speak", "render", "voice", "serve"):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"  {command} "))
        assert lines[at + 1].strip().startswith("python cli.py "), lines[at:at + 2]
    assert "python cli.py render scene1.txt" in run.stdout and "python cli.py voice save" in run.stdout
    assert "cli_" not in run.stdout and ".py " not in run.stdout.replace("cli.py ", "")  # no internal files named
    assert "required" not in run.stdout
    bare = cli_run()  # no command at all: the same list, as an error
    assert bare.returncode == 2 and bare.stderr.strip() == run.stdout.strip()


@pytest.mark.parametrize("command", [["speak"], ["render"], ["voice", "save"], ["voice", "info"], ["serve"]])
def test_each_commands_help_fits_a_screen_and_help_all_shows_the_rest(command):
    short, everything = cli_run(*command, "--help"), cli_run(*command, "--help-all")
    assert short.returncode == everything.returncode == 0, short.stderr + everything.stderr
    assert len(short.stdout.splitlines()) <= 42, short.stdout
    options = set(re.findall(r"^\s+(--[a-z-]+)", everything.stdout, re.M))
    shown = set(re.findall(r"^\s+(--[a-z-]+)", short.stdout, re.M))
    if command[-1] != "info":  # info has a single argument: nothing to leave out
        assert f"more options: python cli.py {' '.join(command)} --help-all" in short.stdout
        assert shown < options and "--models-dir" in options - shown
    parser = {"speak": cli, "render": cli_render, "voice": cli_voice, "serve": cli_serve}[command[0]].build_parser()
    if command[0] == "voice":
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = commands.choices[command[1]]
    every = {option for action in parser._actions for option in action.option_strings
             if option.startswith("--") and action.help is not argparse.SUPPRESS}  # a retired option: taken, unsaid
    assert options - {"--help-all"} == every - {"--help", "--help-all"}  # --help-all leaves nothing out


@pytest.mark.parametrize("argv, answer", [
    (["rendr", "x.txt"], "error: unknown command 'rendr'; did you mean render?"),
    (["voice", "sve", "bob.wav"], "error: unknown command 'voice sve'; did you mean voice save?"),
    (["--txt", "Hi"], "error: unknown option --txt; did you mean --text?"),
    (["speak", "--text", "Hi", "--devise", "cpu"], "error: unknown option --devise; did you mean --device?"),
    (["--text", "Hi", "--device", "cud"], "error: --device: invalid choice 'cud'; did you mean cuda?"),
    (["serve", "--batch", "0"], "error: unknown option --batch; did you mean --batch-size?"),
    (["render", "s.txt", "--batch", "0"], "error: unknown option --batch; did you mean --batch-size?"),
    (["voice", "save", "bob.wav", "--out", "bob", "--x-vector"],
     "error: unknown option --x-vector; did you mean --x-vector-only?"),
])
def test_a_typo_at_every_level_gets_what_was_meant_in_one_line(argv, answer, capsys, no_load):
    with pytest.raises(SystemExit) if argv[0] != "rendr" else contextlib.nullcontext() as ended:
        assert cli.main(argv) == 2
    assert ended is None or ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(answer) and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, abbreviation", [
    (["--text", "Hi", "--temp", "0.5"], "--temp"),
    (["render", "s.txt", "--voice", "A=a.wav", "--batch-s", "4"], "--batch-s"),
    (["serve", "--max-f", "100"], "--max-f"),
    (["voice", "save", "a.wav", "--out", "a", "--forc"], "--forc"),
])
def test_abbreviated_options_are_refused_not_guessed(argv, abbreviation, capsys, no_load):
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: unknown option {abbreviation}; did you mean --")


@pytest.mark.parametrize("argv", [
    ["--text", "Hi"],
    ["render", "scene.txt", "--voice", "Alice=a.wav"],
    ["voice", "save", "a.wav", "--out", "a"],
    ["serve"],
])
def test_a_mistyped_model_is_answered_before_torch_loads(argv, tmp_path):
    """`--model tinyy` next to a folder `tiny`: refused naming the folder meant, in under 3 s with the interpreter's
    start, and with none of the heavy modules imported."""
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); import cli; "
            f"rc = cli.main({argv + ['--model', 'tinyy', '--models-dir', 'models']!r}); "
            "print(rc, sorted(m for m in ('torch', 'transformers', 'qwen_tts') if m in sys.modules))")
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - start
    assert run.stdout.split() == ["2", "[]"], run.stdout + run.stderr
    assert run.stderr.startswith("error: --model: no model folder 'tinyy' (looked in "), run.stderr
    assert "models): did you mean tiny? Or give the path of a checkpoint folder" in run.stderr
    assert took < 3.0, took


def test_the_one_liner_speaks_in_a_saved_voice(tiny_dir, tiny_tts, tmp_path, capsys):
    """A saved voice is read as render reads one, not as a clip; it holds its transcript, so --transcript is refused."""
    from morph.lines.voice import save_voice

    save_voice(tiny_tts.make_voice(speech(2.0), 24000, transcript="Hello there."), tmp_path / "bob.safetensors")
    out = tmp_path / "bob.wav"
    code = cli.main(["--text", "Hi.", "--voice", str(tmp_path / "bob.safetensors"), "--out", str(out),
                     *quick(model=tiny_dir)])
    assert code == 0, capsys.readouterr().err
    assert sf.read(out)[0].size > 0
    capsys.readouterr()
    err = fails(["--text", "Hi.", "--voice", str(tmp_path / "bob.safetensors"), "--transcript", "Hello there.",
                 "--model", str(tiny_dir)], capsys)
    assert err == ("error: --transcript: bob.safetensors is a saved voice, which holds its own transcript (or none); "
                   "leave out --transcript\n")
    (tmp_path / "junk.safetensors").write_bytes(b"not a voice")
    err = fails(["--text", "Hi.", "--voice", str(tmp_path / "junk.safetensors"), "--model", str(tiny_dir),
                 "--out", str(out)], capsys)
    assert err.startswith("error: --voice junk.safetensors: junk.safetensors is not a valid safetensors voice file")
    assert "python cli.py voice save" in err


def test_a_speak_logs_the_attention_kernel_once(tiny_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert cli.main(["--text", "Hi.", "--out", str(tmp_path / "o.wav"), *quick(model=tiny_dir)]) == 0
    assert [r.getMessage() for r in caplog.records].count("Qwen3-TTS attention: sdpa") == 1


def test_the_one_liner_gets_the_engine_ready_for_one_row_before_the_line(tiny_dir, tmp_path, monkeypatch):
    """The load's compiling and capturing (MorphTTS.ready) is its own step, said in the log, not inside the line's
    timed render: once, for one row, before the line is spoken."""
    from morph.api import MorphTTS

    events = []
    monkeypatch.setattr(MorphTTS, "ready", lambda self, width=64, who="": events.append(("ready", width, who)))
    real = MorphTTS.clone
    monkeypatch.setattr(MorphTTS, "clone", lambda self, *a, **k: events.append("line") or real(self, *a, **k))
    assert cli.main(["--text", "Hi.", "--out", str(tmp_path / "hi.wav"), *quick(model=tiny_dir)]) == 0
    assert events == [("ready", 1, "cli.py"), "line"]
