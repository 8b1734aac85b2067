"""`cli.py voice save` and `cli.py voice info` on the tiny model (CPU): the saved file is the one Save Voice writes and
`cli.py render` speaks it; every bad input is refused in the CLI's words, before the model loads where none is needed,
and a failed save leaves nothing behind."""

import errno
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import cli
from tests.test_cli import NODE_WORDS, ROOT, fails, speech
from tests.test_cli_render import options

TRANSCRIPT = "A short reference sentence."


def on_tiny(model):
    return ["--model", str(model), "--device", "cpu"]


def contents(path):
    """A safetensors file's metadata and tensors, as lists."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {name: f.get_tensor(name).tolist() for name in f.keys()}


@pytest.fixture
def bob(tmp_path):
    """A stereo 22.05 kHz clip, as a user's recording may be."""
    path = tmp_path / "bob.wav"
    sf.write(path, speech(2.0, 22050, channels=2), 22050)
    return path


def test_a_saved_voice_is_save_voices_file_and_cli_render_speaks_it(tiny_dir, tiny_tts, tmp_path, bob, capsys):
    out = tmp_path / "voices" / "bob"  # no extension, in a folder that does not exist
    assert cli.main(["voice", "save", str(bob), "--transcript", TRANSCRIPT, "--out", str(out), *on_tiny(tiny_dir)]) == 0
    saved = tmp_path / "voices" / "bob.safetensors"
    assert capsys.readouterr().out == f"wrote {saved}: an ICL voice for 0.6B Base models, transcript {TRANSCRIPT!r}\n"

    from morph.lines.voice import save_voice

    # what the Voice Prompt node makes of the same clip (make_voice), saved as Save Voice saves it
    wave, rate = sf.read(bob, dtype="float32", always_2d=True)
    twin = save_voice(tiny_tts.make_voice(wave, rate, TRANSCRIPT), tmp_path / "twin.safetensors")
    assert contents(saved) == contents(twin)  # not the bytes: safetensors orders the metadata as it likes
    assert sorted(p.name for p in saved.parent.iterdir()) == ["bob.safetensors"]  # no temporary file left

    script = tmp_path / "scene.txt"
    script.write_text("Bob: Hello there, how are you?\n", encoding="utf-8")
    renders = tmp_path / "renders"
    assert cli.main(["render", str(script), *options(tiny_dir, renders, "--voice", f"Bob={saved}")]) == 0
    audio, rate = sf.read(renders / "dialogue_0001_Bob.wav")
    assert rate == 24000 and audio.ndim == 1 and np.abs(audio).max() > 0


def test_info_says_what_a_saved_voice_holds(tiny_dir, tmp_path, bob, capsys):
    out = tmp_path / "bob.safetensors"
    assert cli.main(["voice", "save", str(bob), "--transcript", TRANSCRIPT, "--out", str(out), *on_tiny(tiny_dir)]) == 0
    capsys.readouterr()
    assert cli.main(["voice", "info", str(out)]) == 0
    shown = capsys.readouterr().out.splitlines()
    from morph.lines.voice import load_voice

    frames = load_voice(out).ref_code.shape[0]
    assert shown[0] == f"{out}: a saved Qwen3-TTS voice"
    assert shown[1] == "  works with:  0.6B Base models (hidden size 64)"  # the tiny model's
    assert shown[2].startswith("  mode:        ICL")
    assert shown[3] == f"  transcript:  {TRANSCRIPT!r}"
    assert shown[4] == f"  reference:   {frames / 12.5:.2f} s ({frames} codec frames)" and frames > 0


@pytest.mark.parametrize("flags", [[], ["--transcript", TRANSCRIPT, "--x-vector-only"]])
def test_no_transcript_or_x_vector_only_saves_an_x_vector_voice(flags, tiny_dir, tmp_path, bob, capsys):
    out = tmp_path / "bob.safetensors"
    assert cli.main(["voice", "save", str(bob), *flags, "--out", str(out), *on_tiny(tiny_dir)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out}: an x-vector-only voice for 0.6B Base models, ")
    assert cli.main(["voice", "info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "  mode:        x-vector only" in shown and "reference:" not in shown
    assert ("transcript:  none" in shown) == (not flags)  # --x-vector-only keeps a --transcript, as the node does


@pytest.mark.parametrize("setup, argv, message", [
    (None, ["missing.wav", "--out", "v"], "error: CLIP: file not found: missing.wav\n"),
    ("notes", ["notes.wav", "--out", "v"], "error: CLIP: cannot read notes.wav as audio"),
    ("silent", ["quiet.wav", "--out", "v"], "error: CLIP quiet.wav: the clip is silent; give another recording of "
                                            "the voice to clone as CLIP\n"),
    ("long", ["long.wav", "--transcript", "Words.", "--out", "v"], "or leave out --transcript (or add "
                                                                   "--x-vector-only) to clone from the first 30 s"),
    ("taken", ["bob.wav", "--out", "taken"], "error: --out: taken.safetensors exists; add --force to overwrite it, "
                                             "or give another --out\n"),
    (None, ["bob.wav", "--out", "bob.wav"], "error: --out: a saved voice is a .safetensors file, not .wav; give e.g. "
                                            "bob.safetensors\n"),
    (None, ["bob.wav", "--out", "bob.wav/v"], "error: --out: cannot create the folder bob.wav: bob.wav is a file\n"),
])
def test_bad_input_is_refused_before_loading_naming_its_option(setup, argv, message, tmp_path, bob, capsys, no_load,
                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    if setup == "notes":
        (tmp_path / "notes.wav").write_text("not audio")
    elif setup == "silent":
        sf.write("quiet.wav", np.zeros(48000, np.float32), 24000)
    elif setup == "long":
        sf.write("long.wav", speech(31.0), 24000)
    elif setup == "taken":
        (tmp_path / "taken.safetensors").write_bytes(b"kept")
    err = fails(["voice", "save", *argv], capsys)
    assert message in err and err.count("\n") == 1, err
    assert not any(word in err for word in NODE_WORDS), err
    made = {"notes": "notes.wav", "silent": "quiet.wav", "long": "long.wav", "taken": "taken.safetensors"}
    assert {p.name for p in tmp_path.iterdir()} == {"bob.wav", made.get(setup, "bob.wav")}  # nothing new
    if setup == "taken":
        assert (tmp_path / "taken.safetensors").read_bytes() == b"kept"


@pytest.mark.parametrize("content, message", [
    (None, "error: cli.py voice info: no voice file at missing.safetensors\n"),
    (b"not a voice", "error: cli.py voice info: bob.safetensors is not a valid safetensors voice file"),
    ("other", "error: cli.py voice info: bob.safetensors is a safetensors file but not a Qwen3-TTS voice"),
])
def test_info_on_a_file_that_is_not_a_voice_is_one_error_line(content, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if content == "other":
        import torch
        from safetensors.torch import save_file

        save_file({"weight": torch.zeros(2)}, "bob.safetensors", metadata={"format": "something else"})
    elif content is not None:
        (tmp_path / "bob.safetensors").write_bytes(content)
    err = fails(["voice", "info", "missing.safetensors" if content is None else "bob.safetensors"], capsys)
    assert err.startswith(message) and err.count("\n") == 1, err
    if content is not None:
        assert err.endswith("make it with: python cli.py voice save CLIP --transcript TEXT --out NAME.safetensors\n")


def test_a_model_that_cannot_clone_is_refused_naming_the_option(model_dirs, tmp_path, bob, capsys):
    model = model_dirs("tiny", "custom_voice")
    err = fails(["voice", "save", str(bob), "--out", str(tmp_path / "new" / "bob"), *on_tiny(model)], capsys)
    assert f"error: --model: {model} is a CustomVoice model; cloning a voice needs a Base model" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bob.wav"]  # its --out folder was never made


def test_a_save_that_fails_before_writing_leaves_no_folder(tiny_dir, tmp_path, bob, no_load):
    with pytest.raises(AssertionError, match="loaded before"):  # the load fails after every check passed
        cli.main(["voice", "save", str(bob), "--out", str(tmp_path / "new" / "deeper" / "bob"), *on_tiny(tiny_dir)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bob.wav"]


@pytest.fixture
def full_disk(monkeypatch):
    """A voice file's write (save_voice writes its bytes) runs out of space halfway through the file."""
    def write_bytes(path, data):
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


def test_a_failed_write_removes_the_folders_it_made_and_no_part_is_left(tiny_dir, tmp_path, bob, capsys, full_disk):
    out = tmp_path / "new" / "deeper" / "bob.safetensors"
    err = fails(["voice", "save", str(bob), "--out", str(out), *on_tiny(tiny_dir)], capsys)
    assert err.endswith(f"error: --out: could not write {out} (No space left on device); check the folder's "
                        "permissions and free space, or give another --out\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bob.wav"]


def test_a_failed_overwrite_keeps_the_voice_that_was_there(tiny_dir, tmp_path, bob, capsys, full_disk):
    out = tmp_path / "bob.safetensors"
    with open(out, "wb") as f:  # Path.write_bytes is the full disk's
        f.write(b"the voice before")
    fails(["voice", "save", str(bob), "--out", str(out), "--force", *on_tiny(tiny_dir)], capsys)
    assert out.read_bytes() == b"the voice before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bob.safetensors", "bob.wav"]


def test_the_help_states_each_default_once_and_shows_the_examples(capsys):
    for argv in (["voice", "--help"], ["voice", "save", "--help-all"], ["voice", "info", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert not any(f"(default: {v})" in text for v in ("None", "False", "[]")), argv
        assert "python cli.py voice save bob.wav --transcript" in text and \
            "python cli.py voice info output/voices/bob.safetensors" in text, argv  # where the server looks
        if "save" in argv:
            assert text.count("default") == text.count("(default: auto)") + 2  # --model's, and --models-dir's
            assert "(default: Qwen/Qwen3-TTS-12Hz-0.6B-Base)" in text and "x-vector only" in text


def test_the_checks_that_need_no_model_run_before_torch_and_info_loads_no_model(tmp_path, tiny_tts):
    """A missing or silent clip and a taken --out are refused at once, not after torch's import (seconds on a busy
    machine); info reads a voice with torch alone, never the engine, transformers or qwen-tts."""
    from morph.lines.voice import save_voice

    sf.write(tmp_path / "quiet.wav", np.zeros(48000, np.float32), 24000)
    sf.write(tmp_path / "bob.wav", speech(2.0), 24000)
    save_voice(tiny_tts.make_voice(speech(2.0), 24000, TRANSCRIPT), tmp_path / "taken.safetensors")
    runs = {"['voice', 'save', 'missing.wav', '--out', 'v']": ["2", "False"],
            "['voice', 'save', 'quiet.wav', '--out', 'v']": ["2", "False"],
            "['voice', 'save', 'bob.wav', '--out', 'taken']": ["2", "False"],
            "['voice', 'info', 'taken.safetensors']": ["0", "True"]}
    for argv, answer in runs.items():
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import cli; rc = cli.main({argv}); " \
               "print(rc, 'torch' in sys.modules, any(m.split('.')[0] in ('transformers', 'qwen_tts') or " \
               "m == 'morph.api' for m in sys.modules))"
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert run.stdout.split()[-3:] == [*answer, "False"], (argv, run.stdout, run.stderr)
