"""Every node runs end to end on tiny random-weight models (CPU, no ComfyUI), and fails clearly."""

from __future__ import annotations

import gc
import os
import pickle
import weakref

import numpy as np
import pytest
import torch

from tests.clips import clip_names, write_clip

from .conftest import gen_options

VC, CV, VD = "Qwen3TTSMorphGenerate", "Qwen3TTSMorphCustomVoice", "Qwen3TTSMorphVoiceDesign"


def assert_audio(audio, channels=1, rate=24000):
    assert set(audio) >= {"waveform", "sample_rate"}
    w = audio["waveform"]
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float32 and w.device.type == "cpu"
    assert w.dim() == 3 and w.shape[0] == 1 and w.shape[1] == channels and w.shape[2] > 0
    assert audio["sample_rate"] == rate
    assert torch.isfinite(w).all()


def clone(nodes, model, voice, text="Hello there, this is a test.", **kw):
    return nodes[VC]().generate(model=model, voice=voice, text=text, **gen_options(**kw))[0]


# -- model and voices ---------------------------------------------------------------------------
def test_load_model_gives_a_managed_model_and_lists_local_folders(nodes, base_model, models_root):
    assert base_model.tts.variant == "base" and base_model.patcher is None  # no ComfyUI here
    assert base_model.ready() is base_model.tts
    choices = nodes["Qwen3TTSMorphLoadModel"].INPUT_TYPES()["required"]["model"][0]
    assert choices[:3] == ["tiny-base", "tiny-custom_voice", "tiny-voice_design"]


def test_load_model_errors_name_the_node(nodes, models_root):
    with pytest.raises(FileNotFoundError, match=r"^Qwen3-TTS Load Model: no model folder 'nope' \(looked in "):
        nodes["Qwen3TTSMorphLoadModel"]().load(model="nope", dtype="fp32", attention="sdpa", device="cpu")
    (models_root / "broken").mkdir(exist_ok=True)
    (models_root / "broken" / "config.json").write_text("{}")
    try:
        with pytest.raises(FileNotFoundError, match=r"^Qwen3-TTS Load Model: .*missing"):
            nodes["Qwen3TTSMorphLoadModel"]().load(model="broken", dtype="fp32", attention="sdpa", device="cpu")
    finally:
        (models_root / "broken" / "config.json").unlink()
        (models_root / "broken").rmdir()


def test_the_model_is_freed_when_comfyui_drops_the_output(nodes, models_root):
    handle = nodes["Qwen3TTSMorphLoadModel"]().load(model="tiny-base", dtype="fp32", attention="sdpa",
                                                     device="cpu")[0]
    ref = weakref.ref(handle.tts)
    del handle
    gc.collect()
    assert ref() is None, "something (a module-level cache?) still holds the model"


def test_voice_prompt_from_stereo_44k_audio(nodes, base_model, ref_clip):
    vp = nodes["Qwen3TTSMorphVoicePrompt"]()
    icl = vp.make(base_model, ref_clip, "The words said in the clip.", False)[0]
    assert icl.icl and icl.ref_text == "The words said in the clip."
    xvec = vp.make(base_model, ref_clip, "", False)[0]
    assert not xvec.icl
    forced = vp.make(base_model, ref_clip, "The words said in the clip.", True)[0]
    assert not forced.icl
    assert icl.spk_embedding.shape == xvec.spk_embedding.shape


def test_voice_prompt_errors(nodes, base_model, custom_model, ref_clip):
    vp = nodes["Qwen3TTSMorphVoicePrompt"]()
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Prompt needs a Base"):
        vp.make(custom_model, ref_clip, "", False)
    short = {"waveform": ref_clip["waveform"][..., :4410], "sample_rate": 44100}
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Prompt: .*at least"):
        vp.make(base_model, short, "", False)
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Prompt: audio is not a ComfyUI AUDIO"):
        vp.make(base_model, ref_clip["waveform"], "", False)


@pytest.mark.parametrize("name", clip_names())
def test_voice_prompt_takes_every_common_clip_file_as_load_audio_gives_it(name, nodes, base_model, tmp_path, caplog):
    """ComfyUI's AUDIO is float [1, C, T]: a float WAV over full scale is normalised with a note, and a
    22.05 kHz clip at 0.9986 (which overshoots 1.0 once resampled) is no longer called silent."""
    import logging

    import soundfile as sf

    caplog.set_level(logging.INFO)
    wave, rate = sf.read(write_clip(name, tmp_path), dtype="float32", always_2d=True)
    audio = {"waveform": torch.from_numpy(wave.T.copy())[None], "sample_rate": rate}
    voice = nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, audio, "The words said in the clip.", False)[0]
    assert voice.icl and torch.isfinite(voice.spk_embedding).all()
    assert ("scaled down to peak at 1.0" in caplog.text) == (np.abs(wave).max() > 1.0)


def test_voice_prompt_words_its_fixes_for_the_node(nodes, base_model):
    silent = {"waveform": torch.zeros(1, 2, 48000), "sample_rate": 24000}
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Prompt: reference audio: the clip is silent; connect a "
                                         r"recording of the voice to clone$"):
        nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, silent, "", False)
    long = {"waveform": 0.3 * torch.sin(torch.arange(31 * 8000) / 5.0)[None, None], "sample_rate": 8000}
    with pytest.raises(ValueError, match=r"or clear the transcript \(or turn on x_vector_only\) to clone"):
        nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, long, "All of it.", False)


# -- generation ---------------------------------------------------------------------------------
def test_generate_voice_clone_returns_mono_24k_audio(nodes, base_model, base_voice, ref_clip):
    assert_audio(clone(nodes, base_model, base_voice))
    icl = nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, ref_clip, "The words said in the clip.", False)[0]
    assert_audio(clone(nodes, base_model, icl, max_new_tokens=2))


def test_generate_is_seeded_and_takes_every_seq_groups(nodes, base_model, base_voice):
    a = clone(nodes, base_model, base_voice, seed=7)["waveform"]
    b = clone(nodes, base_model, base_voice, seed=7)["waveform"]
    assert torch.equal(a, b)
    for groups in (1, 15):
        assert_audio(clone(nodes, base_model, base_voice, seq_groups=groups, max_new_tokens=2))


def test_custom_voice_and_voice_design(nodes, custom_model, design_model):
    out = nodes[CV]().generate(model=custom_model, text="Hi, I am Vivian.", speaker="Vivian",
                               instruct="Cheerful.", **gen_options())[0]
    assert_audio(out)
    out = nodes[VD]().generate(model=design_model, text="Hello from a designed voice.",
                               instruct="A calm low voice.", **gen_options(language="Auto"))[0]
    assert_audio(out)


def test_wrong_variant_names_the_variant_needed(nodes, base_model, custom_model, design_model, base_voice):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(Voice Clone\) needs a Base"):
        clone(nodes, custom_model, base_voice)
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(CustomVoice\) needs a CustomVoice.*"
                                         r"Qwen3-TTS-12Hz-0.6B-CustomVoice"):
        nodes[CV]().generate(model=base_model, text="Hi.", speaker="Vivian", instruct="", **gen_options())
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(VoiceDesign\) needs a VoiceDesign"):
        nodes[VD]().generate(model=custom_model, text="Hi.", instruct="Calm.", **gen_options())


def test_unknown_speaker_lists_the_models_speakers(nodes, custom_model):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(CustomVoice\): unknown speaker 'Sohee'.*vivian"):
        nodes[CV]().generate(model=custom_model, text="Hi.", speaker="Sohee", instruct="", **gen_options())


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_text_is_a_clear_error(nodes, base_model, base_voice, text):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(Voice Clone\): (the )?text is empty"):
        clone(nodes, base_model, base_voice, text=text)


def test_bad_settings_are_clear_errors(nodes, base_model, base_voice):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(Voice Clone\): .*seq_groups"):
        clone(nodes, base_model, base_voice, seq_groups=16)
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(Voice Clone\): language 'Klingon'"):
        clone(nodes, base_model, base_voice, language="Klingon")


# -- save and load voices -------------------------------------------------------------------------
def voices_dir(models_root):
    return models_root / "voices"


def test_save_then_load_a_voice(nodes, base_voice, models_root):
    result = nodes["Qwen3TTSMorphSaveVoice"]().save(base_voice, "  my test voice  ")
    name = result["result"][0]
    assert name == "my test voice.safetensors" and (voices_dir(models_root) / name).is_file()
    loader = nodes["Qwen3TTSMorphLoadVoice"]
    assert name in loader.INPUT_TYPES()["required"]["voice"][0]
    voice = loader().load(voice=name)[0]
    assert torch.equal(voice.spk_embedding, base_voice.spk_embedding)
    assert voice.ref_code is base_voice.ref_code is None and voice.ref_text == base_voice.ref_text
    # file_name (from Save Voice's output) wins over the list
    assert torch.equal(loader().load(voice="other.safetensors", file_name=name)[0].spk_embedding,
                       base_voice.spk_embedding)
    # IS_CHANGED follows the file
    before = loader.IS_CHANGED(voice=name)
    os.utime(voices_dir(models_root) / name, ns=(1, 1))
    assert loader.IS_CHANGED(voice=name) != before
    assert loader.VALIDATE_INPUTS(voice=name) is True
    # the bare name, as Save Voice's name widget holds it (what the example workflow keeps in the list)
    assert loader.VALIDATE_INPUTS(voice="my test voice") is True
    assert torch.equal(loader().load(voice="my test voice")[0].spk_embedding, base_voice.spk_embedding)
    assert loader.IS_CHANGED(voice="my test voice") == loader.IS_CHANGED(voice=name)


@pytest.mark.parametrize("value", ["", "  ", "../x", "a/b.safetensors", "a\\b", ".hidden", None])
def test_load_voice_rejects_paths_and_empty_names(nodes, value):
    result = nodes["Qwen3TTSMorphLoadVoice"].VALIDATE_INPUTS(voice=value)
    assert isinstance(result, str) and result.startswith("Qwen3-TTS Load Voice: ") and "not a voice file name" in result


def test_saved_voice_drives_generation(nodes, base_model, base_voice):
    name = nodes["Qwen3TTSMorphSaveVoice"]().save(base_voice, "reused")["result"][0]
    voice = nodes["Qwen3TTSMorphLoadVoice"]().load(voice=name)[0]
    a = clone(nodes, base_model, voice, seed=3)["waveform"]
    b = clone(nodes, base_model, base_voice, seed=3)["waveform"]
    assert torch.equal(a, b)


@pytest.mark.parametrize("name, saved", [("../../escape", ".._.._escape.safetensors"),
                                         ("a/b\\c", "a_b_c.safetensors"),
                                         ("voice.safetensors", "voice.safetensors")])
def test_save_voice_names_cannot_leave_the_voices_folder(nodes, base_voice, models_root, name, saved):
    if saved.startswith("."):
        with pytest.raises(ValueError, match=r"^Qwen3-TTS Save Voice: .*not a usable voice name"):
            nodes["Qwen3TTSMorphSaveVoice"]().save(base_voice, name)
        assert not list(models_root.parent.glob("escape*"))
    else:
        assert nodes["Qwen3TTSMorphSaveVoice"]().save(base_voice, name)["result"][0] == saved
        assert (voices_dir(models_root) / saved).is_file()


def test_empty_voice_name_is_an_error(nodes, base_voice):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Save Voice: '' is not a usable voice name"):
        nodes["Qwen3TTSMorphSaveVoice"]().save(base_voice, "")


class _Boom:
    def __reduce__(self):
        return (os.mkdir, (os.environ["QWEN3TTS_MODELS_DIR"] + "/PWNED",))


def test_corrupt_and_pickled_voice_files_are_rejected(nodes, models_root):
    folder = voices_dir(models_root)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corrupt.safetensors").write_bytes(b"\x00\x01 not a safetensors file")
    (folder / "pickled.safetensors").write_bytes(pickle.dumps(_Boom()))
    loader = nodes["Qwen3TTSMorphLoadVoice"]()
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Load Voice: corrupt.safetensors is not a valid"):
        loader.load(voice="corrupt.safetensors")
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Load Voice: pickled.safetensors is not a valid"):
        loader.load(voice="pickled.safetensors")
    assert not (models_root / "PWNED").exists()
    with pytest.raises(FileNotFoundError, match=r"^Qwen3-TTS Load Voice: no voice file named 'gone.safetensors'"):
        loader.load(voice="gone.safetensors")
    with pytest.raises(FileNotFoundError, match=r"^Qwen3-TTS Load Voice: no voice file named '../x.safetensors'"):
        loader.load(voice="../x.safetensors")


def test_load_voice_lists_nothing_gracefully(pack, monkeypatch, tmp_path):
    monkeypatch.setenv("QWEN3TTS_MODELS_DIR", str(tmp_path / "empty"))
    spec = pack.NODE_CLASS_MAPPINGS["Qwen3TTSMorphLoadVoice"].INPUT_TYPES()
    assert spec["required"]["voice"][0] == []
    assert pack.NODE_CLASS_MAPPINGS["Qwen3TTSMorphLoadModel"].INPUT_TYPES()["required"]["model"][0][0].startswith("Qwen/")


# -- smooth & normalise ----------------------------------------------------------------------------
def test_smooth_and_normalize_any_audio(nodes):
    node = nodes["Qwen3TTSMorphSmooth"]()
    rng = np.random.RandomState(0)
    audio = {"waveform": torch.from_numpy(rng.randn(2, 2, 4410).astype(np.float32) * 0.1), "sample_rate": 44100}
    out = node.process(audio, True, 11000.0, 2, True, -6.0)[0]
    assert out["waveform"].shape == (2, 2, 4410) and out["waveform"].dtype == torch.float32
    assert out["sample_rate"] == 44100
    peaks = out["waveform"].abs().amax(dim=(1, 2))
    assert torch.allclose(peaks, torch.full((2,), 10 ** (-6 / 20)), atol=1e-5)
    same = node.process(audio, False, 11000.0, 2, False, -6.0)[0]
    assert torch.equal(same["waveform"], audio["waveform"])
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Smooth & Normalize: "):
        node.process({"waveform": torch.full((1, 1, 10), float("nan")), "sample_rate": 24000}, True, 11000.0, 2,
                     True, -3.0)


def test_smooth_after_generate(nodes, base_model, base_voice):
    out = nodes["Qwen3TTSMorphSmooth"]().process(clone(nodes, base_model, base_voice), True, 11000.0, 2, True, -3.0)[0]
    assert_audio(out)


def test_long_text_with_splitting_off_is_refused_by_the_node(nodes, base_model, base_voice):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Generate \(Voice Clone\): the text is \d+ characters.*"
                                         r"turn on split_long_text"):
        nodes[VC]().generate(model=base_model, voice=base_voice, text="A sentence. " * 60, split_long_text=False,
                             **gen_options())
