"""Voice files: safetensors round trip, and every malformed file refused before use."""

import json

import pytest
import torch
from safetensors.torch import save_file

from morph.lines.voice import Voice, check_voice_fits, load_voice, save_voice


def icl_voice():
    return Voice(torch.randn(64), torch.randint(0, 2048, (12, 16)), "A reference sentence.", "0b6")


def test_round_trip_keeps_everything(tmp_path):
    for voice in (icl_voice(), Voice(torch.randn(64), None, None, "0b6")):
        path = save_voice(voice, tmp_path / "v.safetensors")
        back = load_voice(path)
        assert torch.equal(back.spk_embedding, voice.spk_embedding)
        assert back.icl == voice.icl and back.ref_text == voice.ref_text and back.model_size == "0b6"
        if voice.icl:
            assert torch.equal(back.ref_code, voice.ref_code)


def write(path, tensors, **meta):
    base = {"format": "qwen3-tts-morph-voice", "version": "1", "mode": "icl", "ref_text": json.dumps("hi"),
            "hidden_size": "64", "model_size": "0b6"}
    base.update(meta)
    save_file(tensors, str(path), metadata=base)
    return path


GOOD = {"spk_embedding": torch.randn(64), "ref_code": torch.randint(0, 2048, (5, 16))}


@pytest.mark.parametrize("tensors, meta, match", [
    ({**GOOD, "spk_embedding": torch.randn(64).half()}, {}, "spk_embedding"),
    ({**GOOD, "spk_embedding": torch.randn(2, 32)}, {}, "spk_embedding"),
    ({**GOOD, "ref_code": torch.randint(0, 2048, (5, 8))}, {}, "malformed ref_code"),
    ({**GOOD, "ref_code": torch.full((5, 16), 5000)}, {}, "malformed ref_code"),
    ({**GOOD, "ref_code": torch.randint(0, 2048, (5, 16)).int()}, {}, "malformed ref_code"),
    (GOOD, {"hidden_size": "2048"}, "metadata says"),
    (GOOD, {"format": "something-else"}, "not a Qwen3-TTS voice"),
    (GOOD, {"version": "9"}, "version"),
    ({"spk_embedding": GOOD["spk_embedding"]}, {}, "mode 'icl' but no ref_code"),
    (GOOD, {"ref_text": json.dumps("")}, "without its transcript"),
])
def test_malformed_voice_files_are_refused(tmp_path, tensors, meta, match):
    path = write(tmp_path / "bad.safetensors", tensors, **meta)
    with pytest.raises(ValueError, match=f"load_voice: .*{match}"):
        load_voice(path)


def test_pickles_and_garbage_are_never_unpickled(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    for name, payload in [("pickle.safetensors", pickle.dumps(Boom())), ("junk.safetensors", b"\x00" * 64)]:
        path = tmp_path / name
        path.write_bytes(payload)
        with pytest.raises(ValueError, match="not a valid safetensors voice file"):
            load_voice(path)
    with pytest.raises(FileNotFoundError, match="no voice file"):
        load_voice(tmp_path / "missing.safetensors")


def test_voice_from_another_model_size_is_refused():
    voice = Voice(torch.randn(2048), None, None, "1b7")
    with pytest.raises(ValueError, match=r"^Generate: this voice was made with a 1.7B model \(embedding size 2048\) "
                                         r"but the loaded model is 0.6B \(size 1024\); make the voice again on this "
                                         r"model: make it with MorphTTS.make_voice"):
        check_voice_fits(voice, 1024, "0b6", "Generate")
    check_voice_fits(voice, 2048, "1b7", "Generate")


@pytest.mark.parametrize("code, fine", [
    (torch.zeros((1, 16), dtype=torch.int64), True),  # one frame of code 0: the least there is
    (torch.full((3, 16), 2047), True),  # the top of the codebook
    (torch.full((3, 16), 2048), False),
    (torch.full((3, 16), -1), False),
    (torch.zeros((0, 16), dtype=torch.int64), False),  # no frame
])
def test_ref_codes_are_checked_at_their_bounds(tmp_path, code, fine):
    path = write(tmp_path / "v.safetensors", {**GOOD, "ref_code": code})
    if fine:
        assert torch.equal(load_voice(path).ref_code, code)
    else:
        with pytest.raises(ValueError, match=r"^load_voice: v.safetensors has a malformed ref_code \(int64 \[T, 16\] "
                                             r"with values below 2048 expected\)$"):
            load_voice(path)


@pytest.mark.parametrize("tensors, meta, message", [
    (GOOD, {"format": "other"}, "v.safetensors is a safetensors file but not a Qwen3-TTS voice (format 'other'); "
                                "make it with MorphTTS.make_voice and morph.lines.voice.save_voice"),
    (GOOD, {"version": "9"}, "v.safetensors has voice format version '9'; this pack reads version 1"),
    (GOOD, {"hidden_size": "32"}, "v.safetensors's embedding has 64 values but its metadata says 32"),
    ({"spk_embedding": GOOD["spk_embedding"]}, {}, "v.safetensors has mode 'icl' but no ref_code"),
    (GOOD, {"mode": "xvector"}, "v.safetensors has mode 'xvector' but a ref_code"),
    (GOOD, {"ref_text": "{"}, "v.safetensors has unreadable ref_text metadata"),
])
def test_each_refusal_says_what_the_file_holds(tmp_path, tensors, meta, message):
    path = write(tmp_path / "v.safetensors", tensors, **meta)
    with pytest.raises(ValueError) as refused:
        load_voice(path)
    assert str(refused.value) == f"load_voice: {message}"


def test_a_voice_file_without_its_optional_metadata_loads_as_an_x_vector_of_unknown_size(tmp_path):
    from safetensors.torch import save_file

    spk = torch.randn(64)
    save_file({"spk_embedding": spk}, str(tmp_path / "v.safetensors"),
              metadata={"format": "qwen3-tts-morph-voice", "version": "1", "mode": "xvector", "hidden_size": "64"})
    voice = load_voice(tmp_path / "v.safetensors")
    assert voice.ref_text is None and voice.ref_code is None and voice.model_size == ""


def test_a_voice_is_saved_into_folders_it_makes(tmp_path):
    path = save_voice(icl_voice(), tmp_path / "a" / "b" / "v.safetensors")
    assert path == tmp_path / "a" / "b" / "v.safetensors" and load_voice(path).ref_text == "A reference sentence."
