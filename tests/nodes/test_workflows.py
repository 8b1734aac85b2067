"""Every example workflow loads (UI format) and queues (API format) as ComfyUI 0.8.0 would take it."""

from __future__ import annotations

import copy
import json

import pytest

from . import workflow_tools as wt
from .conftest import ROOT

WORKFLOWS = sorted((ROOT / "workflows").glob("*.json"))
EXPECTED = {"voice_clone", "seq_groups_ab", "save_and_reuse_voice", "custom_voice", "voice_design", "character_lines"}


@pytest.fixture(scope="module")
def info(pack):
    return wt.combined_object_info(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS)


def load(name):
    return json.loads((ROOT / "workflows" / f"{name}.json").read_text())


def types_in(wf):
    return [n["type"] for n in wf["nodes"]]


def test_the_example_workflows_are_there():
    assert {p.stem for p in WORKFLOWS} == EXPECTED


def test_object_info_of_our_nodes_has_the_servers_shape(info):
    core_keys = set(wt.core_object_info()["SaveAudio"])
    ours = info["Qwen3TTSMorphGenerate"]
    assert {"input", "input_order", "output", "output_is_list", "output_name", "name", "display_name",
            "description", "category", "output_node"} <= set(ours) & core_keys
    assert ours["input_order"]["required"][:3] == ["model", "voice", "text"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_ui_workflow_is_valid(path, info):
    wf = json.loads(path.read_text())
    assert wt.check_ui_workflow(wf, info) == []
    assert all(t.startswith("Qwen3TTSMorph") or t in wt.core_object_info() for t in types_in(wf))


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_api_form_passes_the_prompt_checks(path, info):
    prompt = wt.ui_to_api(json.loads(path.read_text()), info)
    assert wt.validate_prompt(prompt, info) == []
    for node in prompt.values():  # every widget value is in the API form under its input name
        spec = info[node["class_type"]]
        for name, t, opts, category in wt.input_specs(spec):
            if category == "required":
                assert name in node["inputs"], (node["class_type"], name)


def test_workflow_contents(info):
    vc = load("voice_clone")
    assert types_in(vc) == ["LoadAudio", "Qwen3TTSMorphLoadModel", "Qwen3TTSMorphVoicePrompt",
                            "Qwen3TTSMorphGenerate", "Qwen3TTSMorphSmooth", "SaveAudio"]
    api = wt.ui_to_api(vc, info)
    assert api["1"]["inputs"]["audio"] == "reference.wav"
    assert api["4"]["inputs"]["seq_groups"] == 5

    ab = wt.ui_to_api(load("seq_groups_ab"), info)
    gens = [n for n in ab.values() if n["class_type"] == "Qwen3TTSMorphGenerate"]
    assert sorted(g["inputs"]["seq_groups"] for g in gens) == [5, 15]
    same = [{k: v for k, v in g["inputs"].items() if k != "seq_groups"} for g in gens]
    assert same[0] == same[1], "A/B must differ only in seq_groups"
    assert sum(n["class_type"] == "PreviewAudio" for n in ab.values()) == 2

    reuse = wt.ui_to_api(load("save_and_reuse_voice"), info)
    by_type = {n["class_type"]: (k, n) for k, n in reuse.items()}
    save_id, save = by_type["Qwen3TTSMorphSaveVoice"]
    _, loader = by_type["Qwen3TTSMorphLoadVoice"]
    _, gen = by_type["Qwen3TTSMorphGenerate"]
    assert loader["inputs"]["file_name"] == [save_id, 0]  # loads after saving, in the same run
    assert loader["inputs"]["voice"] == save["inputs"]["name"] + ".safetensors"
    assert reuse[gen["inputs"]["voice"][0]]["class_type"] == "Qwen3TTSMorphLoadVoice"

    cv = wt.ui_to_api(load("custom_voice"), info)
    assert any(n["class_type"] == "Qwen3TTSMorphCustomVoice" for n in cv.values())
    assert any("CustomVoice" in str(n["inputs"].get("model")) for n in cv.values())
    vd = wt.ui_to_api(load("voice_design"), info)
    assert any(n["class_type"] == "Qwen3TTSMorphVoiceDesign" for n in vd.values())
    assert any("VoiceDesign" in str(n["inputs"].get("model")) for n in vd.values())


# -- the validator itself catches what it should ----------------------------------------------------
def broken(mutate):
    wf = load("voice_clone")
    mutate(wf)
    return wf


def node_of(wf, type_):
    return next(n for n in wf["nodes"] if n["type"] == type_)


@pytest.mark.parametrize("mutate, expected", [
    (lambda wf: node_of(wf, "Qwen3TTSMorphGenerate")["widgets_values"].pop(4), "widgets_values"),
    (lambda wf: node_of(wf, "Qwen3TTSMorphGenerate")["widgets_values"].__setitem__(2, 16), "above the maximum"),
    (lambda wf: node_of(wf, "Qwen3TTSMorphGenerate")["widgets_values"].__setitem__(1, "Klingon"), "not one of"),
    (lambda wf: node_of(wf, "Qwen3TTSMorphGenerate")["widgets_values"].__setitem__(4, "sometimes"), "not one of"),
    (lambda wf: node_of(wf, "Qwen3TTSMorphSmooth")["widgets_values"].__setitem__(2, 2.5), "not an INT"),
    (lambda wf: node_of(wf, "Qwen3TTSMorphSmooth").__setitem__("type", "NoSuchNode"), "unknown node type"),
    (lambda wf: wf["links"][0].__setitem__(5, "AUDIO"), "typed AUDIO"),
    (lambda wf: wf["nodes"].remove(node_of(wf, "SaveAudio")), "no output node"),
    (lambda wf: wf["links"].pop(0), "does not exist"),
])
def test_validator_catches_broken_workflows(info, mutate, expected):
    errors = wt.check_ui_workflow(broken(mutate), info)
    assert any(expected in e for e in errors), errors


def test_prompt_checks_catch_what_the_server_rejects(info):
    good = wt.ui_to_api(load("voice_clone"), info)
    assert wt.validate_prompt(good, info) == []

    def errors(mutate):
        p = copy.deepcopy(good)
        mutate(p)
        return " | ".join(wt.validate_prompt(p, info))

    assert "does not exist" in errors(lambda p: p["5"].__setitem__("class_type", "Nope"))
    assert "no outputs" in errors(lambda p: p.pop("6"))
    assert "missing" in errors(lambda p: p["4"]["inputs"].pop("voice"))
    assert "expected QWEN3TTS_VOICE" in errors(lambda p: p["4"]["inputs"].__setitem__("voice", ["1", 0]))
    assert "not one of" in errors(lambda p: p["2"]["inputs"].__setitem__("dtype", "int4"))
    assert "below the minimum" in errors(lambda p: p["4"]["inputs"].__setitem__("seq_groups", 0))


def test_load_voice_accepts_a_voice_saved_in_the_same_run_but_not_a_path(info):
    prompt = wt.ui_to_api(load("save_and_reuse_voice"), info)
    loader = next(n for n in prompt.values() if n["class_type"] == "Qwen3TTSMorphLoadVoice")
    assert wt.validate_prompt(prompt, info) == []  # the file does not exist yet
    loader["inputs"]["voice"] = "../../secrets.safetensors"
    assert any("not a voice file name" in e for e in wt.validate_prompt(prompt, info))
