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
    with pytest.raises(ValueError, match="Generate: this voice was made with a 1.7B model"):
        check_voice_fits(voice, 1024, "0b6", "Generate")
