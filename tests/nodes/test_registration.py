"""The pack imports the way ComfyUI imports it, with no ComfyUI present, and its node classes are well formed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from .conftest import ROOT

IDS = {
    "Qwen3TTSMorphLoadModel": "Qwen3-TTS Load Model",
    "Qwen3TTSMorphVoicePrompt": "Qwen3-TTS Voice Prompt",
    "Qwen3TTSMorphSaveVoice": "Qwen3-TTS Save Voice",
    "Qwen3TTSMorphLoadVoice": "Qwen3-TTS Load Voice",
    "Qwen3TTSMorphGenerate": "Qwen3-TTS Generate (Voice Clone)",
    "Qwen3TTSMorphCustomVoice": "Qwen3-TTS Generate (CustomVoice)",
    "Qwen3TTSMorphVoiceDesign": "Qwen3-TTS Generate (VoiceDesign)",
    "Qwen3TTSMorphSmooth": "Qwen3-TTS Smooth & Normalize",
    "Qwen3TTSMorphVoiceBank": "Qwen3-TTS Voice Bank",
    "Qwen3TTSMorphRenderLines": "Qwen3-TTS Render Lines",
}
WIDGETS = {"INT", "FLOAT", "STRING", "BOOLEAN"}
CUSTOM = {"QWEN3TTS_MODEL", "QWEN3TTS_VOICE", "QWEN3TTS_VOICE_BANK", "AUDIO"}
GENERATION = ["language", "seq_groups", "seed", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p",
              "repetition_penalty", "subtalker_do_sample", "subtalker_temperature", "subtalker_top_k",
              "subtalker_top_p"]
# The widget order is saved positionally in every workflow: changing it breaks them.
ORDER = {
    "Qwen3TTSMorphLoadModel": ["model", "dtype", "attention", "device", "speed_mode"],
    "Qwen3TTSMorphVoicePrompt": ["model", "audio", "transcript", "x_vector_only"],
    "Qwen3TTSMorphSaveVoice": ["voice", "name"],
    "Qwen3TTSMorphLoadVoice": ["voice", "file_name"],
    "Qwen3TTSMorphGenerate": ["model", "voice", "text"] + GENERATION + ["split_long_text"],
    "Qwen3TTSMorphCustomVoice": ["model", "text", "speaker", "instruct"] + GENERATION + ["split_long_text"],
    "Qwen3TTSMorphVoiceDesign": ["model", "text", "instruct"] + GENERATION + ["split_long_text"],
    "Qwen3TTSMorphSmooth": ["audio", "lowpass_enabled", "cutoff_hz", "order", "normalize_enabled", "target_dbfs"],
    "Qwen3TTSMorphVoiceBank": ["name", "voice", "bank"],
    "Qwen3TTSMorphRenderLines": ["model", "bank", "script", "batch_size", "batching", "pause_seconds", "smoothing",
                                 "resume", "filename_prefix"] + GENERATION,
}


def all_inputs(cls):
    types = cls.INPUT_TYPES()
    assert set(types) <= {"required", "optional", "hidden"}
    return [(name, spec) for section in ("required", "optional") for name, spec in types.get(section, {}).items()]


def test_mappings_ids_names_and_category(pack):
    assert pack.NODE_DISPLAY_NAME_MAPPINGS == IDS
    assert set(pack.NODE_CLASS_MAPPINGS) == set(IDS)
    for node_id, cls in pack.NODE_CLASS_MAPPINGS.items():
        assert cls.CATEGORY == "audio/Qwen3-TTS"
        assert callable(getattr(cls, cls.FUNCTION)), node_id
        assert isinstance(cls.RETURN_TYPES, tuple)
        assert len(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)) == len(cls.RETURN_TYPES)
        assert len(getattr(cls, "OUTPUT_TOOLTIPS", cls.RETURN_TYPES)) == len(cls.RETURN_TYPES)
        assert isinstance(cls.DESCRIPTION, str) and len(cls.DESCRIPTION) > 40, node_id


def test_return_types(pack):
    m = pack.NODE_CLASS_MAPPINGS
    assert m["Qwen3TTSMorphLoadModel"].RETURN_TYPES == ("QWEN3TTS_MODEL",)
    assert m["Qwen3TTSMorphVoicePrompt"].RETURN_TYPES == ("QWEN3TTS_VOICE",)
    assert m["Qwen3TTSMorphLoadVoice"].RETURN_TYPES == ("QWEN3TTS_VOICE",)
    assert m["Qwen3TTSMorphSaveVoice"].RETURN_TYPES == ("STRING",) and m["Qwen3TTSMorphSaveVoice"].OUTPUT_NODE
    for node_id in ("Qwen3TTSMorphGenerate", "Qwen3TTSMorphCustomVoice", "Qwen3TTSMorphVoiceDesign",
                    "Qwen3TTSMorphSmooth"):
        assert m[node_id].RETURN_TYPES == ("AUDIO",)
    writers = {"Qwen3TTSMorphSaveVoice", "Qwen3TTSMorphRenderLines"}  # they write files, so they always run
    assert {k for k, c in m.items() if getattr(c, "OUTPUT_NODE", False)} == writers


@pytest.mark.parametrize("node_id", sorted(IDS))
def test_input_types_are_well_formed(pack, node_id):
    cls = pack.NODE_CLASS_MAPPINGS[node_id]
    inputs = all_inputs(cls)
    assert [name for name, _ in inputs] == ORDER[node_id]
    for name, spec in inputs:
        assert isinstance(spec, tuple) and len(spec) == 2, name
        kind, opts = spec
        assert isinstance(opts, dict) and isinstance(opts.get("tooltip"), str) and opts["tooltip"].strip(), name
        if isinstance(kind, list):
            assert all(isinstance(v, str) for v in kind) and len(set(kind)) == len(kind), name
            if "default" in opts:
                assert opts["default"] in kind, name
            continue
        assert kind in WIDGETS | CUSTOM, (name, kind)
        if kind in ("INT", "FLOAT"):
            assert opts["min"] <= opts["default"] <= opts["max"], name
            assert opts.get("step", 1) > 0
            if kind == "INT":
                assert all(isinstance(opts[k], int) and not isinstance(opts[k], bool) for k in ("min", "max", "default"))
        elif kind == "BOOLEAN":
            assert isinstance(opts["default"], bool), name
        elif kind == "STRING":
            assert opts.get("forceInput") or isinstance(opts["default"], str), name


def test_generate_widgets_are_shared_and_seed_controls_after_generate(pack):
    m = pack.NODE_CLASS_MAPPINGS
    specs = [dict(all_inputs(m[k])) for k in ("Qwen3TTSMorphGenerate", "Qwen3TTSMorphCustomVoice",
                                               "Qwen3TTSMorphVoiceDesign")]
    for name in GENERATION:
        assert specs[0][name] == specs[1][name] == specs[2][name]
    g = specs[0]
    assert g["seed"][1]["control_after_generate"] is True
    assert (g["seq_groups"][1]["min"], g["seq_groups"][1]["max"], g["seq_groups"][1]["default"]) == (1, 15, 5)
    assert "15" in g["seq_groups"][1]["tooltip"] and "faster" in g["seq_groups"][1]["tooltip"]
    assert g["max_new_tokens"][1]["default"] == 0
    assert g["language"][0] == ["Auto", "Chinese", "English", "French", "German", "Italian", "Japanese", "Korean",
                                "Portuguese", "Russian", "Spanish"]
    assert g["text"][1]["multiline"] is True


def test_load_model_choices(pack):
    spec = dict(all_inputs(pack.NODE_CLASS_MAPPINGS["Qwen3TTSMorphLoadModel"]))
    for hub in ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
                "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
                "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"):
        assert hub in spec["model"][0]
    assert spec["dtype"][0] == ["auto", "bf16", "fp16", "fp32"]
    assert spec["attention"][0] == ["auto", "sdpa", "flash_attention_2", "eager"]
    assert spec["device"][0] == ["auto", "cuda", "cpu", "mps"]


def test_smooth_defaults(pack):
    spec = dict(all_inputs(pack.NODE_CLASS_MAPPINGS["Qwen3TTSMorphSmooth"]))
    assert [spec[k][1]["default"] for k in ORDER["Qwen3TTSMorphSmooth"][1:]] == [True, 11000.0, 2, True, -3.0]
    assert (spec["order"][1]["min"], spec["order"][1]["max"]) == (1, 8)
    assert (spec["target_dbfs"][1]["min"], spec["target_dbfs"][1]["max"]) == (-60.0, 0.0)


def test_importing_the_pack_like_comfyui_needs_no_comfyui_and_no_model():
    """A fresh interpreter: exec the root __init__.py as ComfyUI's loader does (path-like module name)."""
    code = textwrap.dedent(f"""
        import importlib.util, os, sys
        root = {str(ROOT)!r}
        name = root.replace(".", "_x_")
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        assert len(module.NODE_CLASS_MAPPINGS) == 10
        bad = {{"folder_paths", "comfy", "qwen_tts", "transformers"}} & set(sys.modules)
        assert not bad, bad
        assert "nodes" not in sys.modules, "the pack must import its own nodes relatively"
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
