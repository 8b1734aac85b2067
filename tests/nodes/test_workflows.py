"""Every example workflow loads (UI format) and queues (API format) as ComfyUI would take it, with no deprecated node
(core nodes as ComfyUI 0.33.0 describes them: workflow_tools)."""

from __future__ import annotations

import copy
import json

import pytest

from . import workflow_tools as wt
from .conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"

WORKFLOWS = sorted((ROOT / "workflows").glob("*.json"))
# file names are the template titles the frontend shows
EXPECTED = {"Voice clone", "Compare seq_groups 15 and 5", "Save and reuse a voice", "CustomVoice speaker",
            "VoiceDesign from a description", "Character lines"}


@pytest.fixture(scope="module")
def info(pack):
    return wt.combined_object_info(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS)


def load(name):
    return json.loads((ROOT / "workflows" / f"{name}.json").read_text())


def types_in(wf):
    return [n["type"] for n in wf["nodes"] if n["type"] not in wt.FRONTEND_ONLY]


def test_the_example_workflows_are_there():
    assert {p.stem for p in WORKFLOWS} == EXPECTED


def test_object_info_of_our_nodes_has_the_servers_shape(info):
    core_keys = set(wt.core_object_info()["SaveAudioAdvanced"])
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
    vc = load("Voice clone")
    assert types_in(vc) == ["LoadAudio", "Qwen3TTSMorphLoadModel", "Qwen3TTSMorphVoicePrompt",
                            "Qwen3TTSMorphGenerate", "Qwen3TTSMorphSmooth", "SaveAudioAdvanced"]
    api = wt.ui_to_api(vc, info)
    assert api["1"]["inputs"]["audio"] == "reference.wav"
    assert api["4"]["inputs"]["seq_groups"] == 5

    ab = wt.ui_to_api(load("Compare seq_groups 15 and 5"), info)
    gens = [n for n in ab.values() if n["class_type"] == "Qwen3TTSMorphGenerate"]
    assert sorted(g["inputs"]["seq_groups"] for g in gens) == [5, 15]
    same = [{k: v for k, v in g["inputs"].items() if k != "seq_groups"} for g in gens]
    assert same[0] == same[1], "A/B must differ only in seq_groups"
    assert sum(n["class_type"] == "PreviewAudio" for n in ab.values()) == 2

    reuse = wt.ui_to_api(load("Save and reuse a voice"), info)
    by_type = {n["class_type"]: (k, n) for k, n in reuse.items()}
    save_id, save = by_type["Qwen3TTSMorphSaveVoice"]
    _, loader = by_type["Qwen3TTSMorphLoadVoice"]
    _, gen = by_type["Qwen3TTSMorphGenerate"]
    assert loader["inputs"]["file_name"] == [save_id, 0]  # loads after saving, in the same run
    # the bare name, as Save Voice's name: a value ending in .safetensors that is not in the list yet would be
    # reported by the frontend as a missing model (test_no_combo_value_is_reported_as_a_missing_model)
    assert loader["inputs"]["voice"] == save["inputs"]["name"]
    assert reuse[gen["inputs"]["voice"][0]]["class_type"] == "Qwen3TTSMorphLoadVoice"

    cv = wt.ui_to_api(load("CustomVoice speaker"), info)
    assert any(n["class_type"] == "Qwen3TTSMorphCustomVoice" for n in cv.values())
    assert any("CustomVoice" in str(n["inputs"].get("model")) for n in cv.values())
    vd = wt.ui_to_api(load("VoiceDesign from a description"), info)
    assert any(n["class_type"] == "Qwen3TTSMorphVoiceDesign" for n in vd.values())
    assert any("VoiceDesign" in str(n["inputs"].get("model")) for n in vd.values())


# -- as the frontend opens them: layout, notes, thumbnails -------------------------------------------
@pytest.fixture(scope="module")
def sizes():
    return wt.frontend_sizes()


def test_recorded_frontend_sizes_match_the_nodes(info, sizes):
    """A node that gained or lost a widget changes size: record again (tests/nodes/real_frontend.py --record-fixture)."""
    types = {n["type"] for p in WORKFLOWS for n in json.loads(p.read_text())["nodes"]}
    assert wt.stale_sizes(info, sizes, types | {t for t in info if t.startswith("Qwen3TTSMorph")}) == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_opens_without_overlaps_and_clear_of_the_sidebar(path, sizes):
    assert wt.layout_problems(json.loads(path.read_text()), sizes) == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_opens_readable_when_fitted_as_a_template(path, sizes):
    """Frontend 1.49+ opens a template fitted into the window; "Save and reuse a voice" opened at 57% there,
    below the zoom that draws text."""
    assert wt.fitted_scale(json.loads(path.read_text()), sizes) >= wt.READABLE_FIT


@pytest.fixture
def fresh_info(pack, monkeypatch, tmp_path):
    """object_info of a fresh install: no saved voices yet."""
    monkeypatch.setenv("QWEN3TTS_MODELS_DIR", str(tmp_path / "empty"))
    info = wt.combined_object_info(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS)
    assert info["Qwen3TTSMorphLoadVoice"]["input"]["required"]["voice"][0] == []
    return info


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_no_combo_value_is_reported_as_a_missing_model(path, fresh_info):
    """On a fresh install, nothing in the workflow looks like a missing model file to the frontend:
    "Save and reuse a voice" kept my_voice.safetensors in Load Voice, and frontend 1.49 showed
    "my_voice.safetensors is missing" although the workflow's own Save Voice writes it."""
    assert wt.missing_model_flags(json.loads(path.read_text()), fresh_info) == []


def test_missing_model_check_flags_what_the_frontend_flags(fresh_info):
    info = fresh_info
    wf = load("Save and reuse a voice")
    loader = node_by_type(wf, "Qwen3TTSMorphLoadVoice")
    loader["widgets_values"][0] = "my_voice.safetensors"
    assert wt.missing_model_flags(wf, info) == [
        f"node {loader['id']} (Qwen3TTSMorphLoadVoice) voice='my_voice.safetensors': the frontend reports a "
        "missing model"]
    loader["mode"] = 4  # bypassed: not scanned
    assert wt.missing_model_flags(wf, info) == []


def node_by_type(wf, type_):
    return next(n for n in wf["nodes"] if n["type"] == type_)


@pytest.mark.parametrize("mutate, expected", [
    # the case: a long title widens the node over its neighbour
    (lambda wf: node_by_type(wf, "Qwen3TTSMorphVoicePrompt").__setitem__(
        "title", "Qwen3-TTS Voice Prompt (Alice: type the clip's transcript for a closer match)"), "overlap"),
    (lambda wf: node_by_type(wf, "Qwen3TTSMorphVoiceBank")["pos"].__setitem__(0, 700), "overlap"),
    (lambda wf: node_by_type(wf, "LoadAudio")["pos"].__setitem__(0, 40), "under the sidebar"),
    (lambda wf: wf["extra"]["ds"].__setitem__("offset", [0, -60]), "under the top bars"),
    (lambda wf: wf["groups"].append({"title": "g", "bounding": [0, 0, 300, 300]}), "straddles"),
    (lambda wf: node_by_type(wf, "SaveAudioAdvanced")["pos"].__setitem__(0, 2000), "off the 1600x900 window"),
    (lambda wf: node_by_type(wf, "SaveAudioAdvanced")["pos"].__setitem__(1, 1100), "under the minimap"),
    (lambda wf: wf["groups"].append({"title": "g", "bounding": [1700, 900, 300, 300]}), "group 'g' reaches under"),
    (lambda wf: node_by_type(wf, "PreviewAudio")["pos"].__setitem__(0, 1900), "nodes draw without text"),
    (lambda wf: node_by_type(wf, "SaveAudioAdvanced")["pos"].__setitem__(1, 800),
     "under the minimap in the fitted view"),
])
def test_layout_check_catches_what_the_frontend_would_show(sizes, mutate, expected):
    wf = load("Character lines")
    mutate(wf)
    assert any(expected in p for p in wt.layout_problems(wf, sizes)), wt.layout_problems(wf, sizes)


def test_a_shrunk_node_is_widened_as_the_frontend_does(sizes):
    wf = load("Voice clone")
    node = node_by_type(wf, "LoadAudio")
    node.update(size=[10, 10], title="Load Audio (Alice's reference clip)")
    x, y, w, h = wt.node_boxes(wf, sizes)[node["id"]]
    # what frontend 1.35.9's computeSize() gave for this node and title
    assert abs(w - 267.98) < 1.5 and h == 136 + sizes["title_height"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_names_its_input_files_in_a_note(path):
    wf = json.loads(path.read_text())
    notes = [n["widgets_values"][0] for n in wf["nodes"] if n["type"] in wt.FRONTEND_ONLY]
    assert len(notes) == 1, "one Note says what the workflow needs"
    audio = {n["widgets_values"][0] for n in wf["nodes"] if n["type"] == "LoadAudio"}
    assert audio <= {"reference.wav"}, "the examples need only input/reference.wav"
    for name in audio:
        assert f"ComfyUI/input/{name}" in notes[0]
    if not audio:
        assert "no input file" in notes[0]
    for node in wf["nodes"]:
        if node["type"] == "Qwen3TTSMorphLoadModel":
            assert node["widgets_values"][0] in notes[0]


def test_readme_lists_each_workflow_and_its_inputs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Example workflows", 1)[1].split("\n## ", 1)[0]
    assert "ComfyUI/input/reference.wav" in section
    for path in WORKFLOWS:
        line = next((x for x in section.splitlines() if f"`{path.name}`" in x), None)
        assert line is not None, f"{path.name} is not in the README's Example workflows"
        needs = "reference.wav" if any(n["type"] == "LoadAudio" for n in json.loads(path.read_text())["nodes"]) \
            else "no input file"
        assert needs in line, (path.name, line)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_template_has_a_thumbnail(path):
    """Browse Templates shows <name>.jpg beside each custom node's workflow as its card image."""
    jpg = path.with_suffix(".jpg")
    assert jpg.is_file()
    data = jpg.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and 5_000 < len(data) < 200_000


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_api_form_is_what_the_real_frontend_queues(path, info):
    """tests/fixtures/frontend_api/ holds app.graphToPrompt() of each workflow in frontend 1.35.9
    (tests/nodes/real_frontend.py --api); tools/comfy_gpu_run.py queues this converter's output instead."""
    recorded = json.loads((FIXTURES / "frontend_api" / path.name).read_text())
    mine = wt.ui_to_api(json.loads(path.read_text()), info)
    # audioUI is the frontend's audio player widget: sent along, ignored by the server
    strip = lambda p: {k: (v["class_type"], {n: x for n, x in v["inputs"].items() if n != "audioUI"})  # noqa: E731
                       for k, v in p.items()}
    assert strip(mine) == strip(recorded)


# -- the validator itself catches what it should ----------------------------------------------------
def broken(mutate):
    wf = load("Voice clone")
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
    (lambda wf: wf["nodes"].remove(node_of(wf, "SaveAudioAdvanced")), "no output node"),
    (lambda wf: node_of(wf, "SaveAudioAdvanced")["widgets_values"].__setitem__(1, "wav"), "not one of"),
    (lambda wf: wf["links"].pop(0), "does not exist"),
])
def test_validator_catches_broken_workflows(info, mutate, expected):
    errors = wt.check_ui_workflow(broken(mutate), info)
    assert any(expected in e for e in errors), errors



def test_a_deprecated_core_node_fails_the_check_though_it_would_run(info):
    """ComfyUI 0.25 and later mark the per-format save nodes deprecated (the frontend's [DEPR] badge; Save Audio (FLAC)
    was what five examples used): a workflow that uses one fails here."""
    core = wt.core_object_info()
    assert {name for name, spec in core.items() if name.startswith("SaveAudio") and spec["deprecated"]} == {
        "SaveAudio", "SaveAudioMP3", "SaveAudioOpus"}
    wf = load("Voice clone")
    node = node_of(wf, "SaveAudioAdvanced")
    node.update(type="SaveAudio", widgets_values=node["widgets_values"][:1],
                inputs=[i for i in node["inputs"] if i["name"] != "format"])
    assert wt.check_ui_workflow(wf, info) == [
        f"node {node['id']} (SaveAudio): deprecated: the frontend shows it as 'Save Audio (FLAC) (DEPRECATED)' with a "
        "[DEPR] badge; use the node that replaces it"]
    assert wt.validate_prompt(wt.ui_to_api(wf, info), info) == []

def test_prompt_checks_catch_what_the_server_rejects(info):
    good = wt.ui_to_api(load("Voice clone"), info)
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
    prompt = wt.ui_to_api(load("Save and reuse a voice"), info)
    loader = next(n for n in prompt.values() if n["class_type"] == "Qwen3TTSMorphLoadVoice")
    assert wt.validate_prompt(prompt, info) == []  # the file does not exist yet
    loader["inputs"]["voice"] = "../../secrets.safetensors"
    assert any("not a voice file name" in e for e in wt.validate_prompt(prompt, info))


def test_speed_mode_offers_the_live_modes_and_a_workflow_saved_with_compile_still_queues(info):
    from morph.decode import runner

    modes = info["Qwen3TTSMorphLoadModel"]["input"]["required"]["speed_mode"][0]
    assert modes == ["auto", "fused", "graphs", "eager"] and all(runner.check_mode(m) == m for m in modes)
    prompt = wt.ui_to_api(load("Voice clone"), info)
    loader = next(n for n in prompt.values() if n["class_type"] == "Qwen3TTSMorphLoadModel")
    loader["inputs"]["speed_mode"] = "compile"  # retired: runs fused
    assert wt.validate_prompt(prompt, info) == []
    loader["inputs"]["speed_mode"] = "turbo"
    assert wt.validate_prompt(prompt, info) == [
        "#2 Qwen3TTSMorphLoadModel: custom validation failed: Qwen3-TTS Load Model: speed_mode 'turbo' is not one "
        "of auto, fused, graphs, eager"]
