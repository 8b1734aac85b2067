"""Voice Bank and Render Lines end to end on the tiny models (CPU, no ComfyUI, or ComfyUI simulated at the
seam): outputs, SRT, progress and cancel, resume after a crash, and the character_lines workflow."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys

import numpy as np
import pytest
import torch

from . import workflow_tools as wt
from .conftest import ROOT, SR, gen_options

BANK, RENDER = "Qwen3TTSMorphVoiceBank", "Qwen3TTSMorphRenderLines"
SCRIPT = """# a short scene
Alice: Did you hear that?
bob: Only the wind.

ALICE: It sounded like footsteps.
Bob: Go back to sleep, Alice.
alice: Fine. Good night, then.
"""
SPOKEN = [("Alice", "Did you hear that?"), ("Bob", "Only the wind."), ("Alice", "It sounded like footsteps."),
          ("Bob", "Go back to sleep, Alice."), ("Alice", "Fine. Good night, then.")]


@pytest.fixture(scope="module")
def batch_nodes(pack):
    return sys.modules[pack.__name__ + ".nodes.batch"]


@pytest.fixture(scope="module")
def second_voice(nodes, base_model):
    """An ICL voice, so a batch mixes x-vector and ICL prompts."""
    rng = np.random.RandomState(2)
    t = np.arange(2 * SR) / SR
    wave = (0.25 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.randn(t.size)).astype(np.float32)
    audio = {"waveform": torch.from_numpy(wave)[None, None], "sample_rate": SR}
    return nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, audio, "Two words.", False)[0]


@pytest.fixture(scope="module")
def bank(nodes, base_voice, second_voice):
    first = nodes[BANK]().add("Alice", base_voice)[0]
    return nodes[BANK]().add("Bob", second_voice, bank=first)[0]


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN3TTS_OUTPUT_DIR", str(tmp_path / "output"))
    return tmp_path / "output"


def render(nodes, model, bank, script=SCRIPT, batch_size=2, pause_seconds=0.5, smoothing=False, resume=False,
           filename_prefix="scene/take", batching="continuous", **kw):
    return nodes[RENDER]().render(model=model, bank=bank, script=script, batch_size=batch_size, batching=batching,
                                  pause_seconds=pause_seconds, smoothing=smoothing, resume=resume,
                                  filename_prefix=filename_prefix, **gen_options(**kw))


def line_files(out_dir):
    return sorted(p.name for p in (out_dir / "scene").glob("take_*.wav"))


# -- Voice Bank --------------------------------------------------------------------------------------
def test_voice_bank_chains_without_touching_the_upstream_bank(nodes, base_voice, second_voice):
    first = nodes[BANK]().add("  Old   Man ", base_voice)[0]
    chained = nodes[BANK]().add("Zoë", second_voice, bank=first)[0]
    assert first == {"old man": ("Old Man", base_voice)}
    assert chained == {"old man": ("Old Man", base_voice), "zoë": ("Zoë", second_voice)}


@pytest.mark.parametrize("name, message", [
    ("old man", r"'old man' is already in the bank \(as 'Old Man'\)"),
    ("", "the character name is empty"),
    ("Dr: Who", "the character name 'Dr: Who' cannot hold ':'"),
])
def test_voice_bank_errors_name_the_node(nodes, base_voice, name, message):
    first = nodes[BANK]().add("Old Man", base_voice)[0]
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Bank: " + message):
        nodes[BANK]().add(name, base_voice, bank=first)


def test_voice_bank_rejects_what_is_not_a_voice_or_a_bank(nodes, base_voice):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Bank: voice is not a Qwen3-TTS voice"):
        nodes[BANK]().add("Alice", {"waveform": None})
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Voice Bank: bank is not a voice bank"):
        nodes[BANK]().add("Alice", base_voice, bank=["Bob"])


# -- Render Lines ----------------------------------------------------------------------------------------
def test_render_lines_outputs_a_list_a_dialogue_and_srt(nodes, base_model, bank, out_dir):
    cls = nodes[RENDER]
    assert cls.OUTPUT_IS_LIST == (True, False, False) and cls.RETURN_TYPES == ("AUDIO", "AUDIO", "STRING")
    clips, dialogue, srt = render(nodes, base_model, bank)
    assert len(clips) == len(SPOKEN)
    for clip in clips:
        w = clip["waveform"]
        assert w.dtype == torch.float32 and w.shape[:2] == (1, 1) and w.shape[2] > 0 and clip["sample_rate"] == SR
    pause = int(0.5 * SR)
    sizes = [c["waveform"].shape[2] for c in clips]
    d = dialogue["waveform"]
    assert d.shape == (1, 1, sum(sizes) + pause * (len(clips) - 1)) and dialogue["sample_rate"] == SR
    assert torch.equal(d[0, 0, sizes[0] + pause: sizes[0] + pause + sizes[1]], clips[1]["waveform"][0, 0])
    # resume off still writes every line, once, as WAV, and the subtitles beside them
    assert sorted(p.name for p in (out_dir / "scene").iterdir()) == sorted(
        [f"take_{i:04d}_{name}.wav" for i, (name, _) in enumerate(SPOKEN, start=1)] + ["take.srt", "take_lines.json"])
    assert (out_dir / "scene" / "take.srt").read_text(encoding="utf-8") == srt
    assert cls.OUTPUT_NODE is True

    blocks = srt.strip().split("\n\n")
    assert len(blocks) == len(SPOKEN)
    at = 0
    for n, (block, (name, text), size) in enumerate(zip(blocks, SPOKEN, sizes, strict=True), start=1):
        number, times, words = block.split("\n")
        assert number == str(n) and words == f"{name}: {text}"
        m = re.fullmatch(r"(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})", times)
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, m.groups())
        start, end = h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000
        assert abs(start - at / SR) < 1e-3 and abs(end - (at + size) / SR) < 1e-3
        at += size + pause


@pytest.mark.parametrize("batching, mode", [("continuous", "lean"), ("static", "lean"), ("continuous", "eager")])
def test_the_retired_batching_widget_changes_nothing_and_static_says_so(
        nodes, pack, base_model, bank, out_dir, batch_nodes, monkeypatch, caplog, batching, mode):
    """Saved workflows still set `batching` (widget values are positional): the render runs as the speed mode does,
    the continuous batch in every mode but eager, and declares that render's memory."""
    ran = []
    real_memory = batch_nodes.working_memory
    monkeypatch.setattr(batch_nodes, "working_memory",
                        lambda tts, *a, **k: ran.append(tts.patch.resolved_mode(tts.device))
                        or real_memory(tts, *a, **k))
    monkeypatch.setattr(base_model.tts.patch, "mode", mode)
    with caplog.at_level("WARNING"):
        clips, _, _ = render(nodes, base_model, bank, batching=batching)
    assert ran == [mode] and base_model.tts.patch.last_run["mode"] == mode
    assert len(clips) == len(SPOKEN) and all(c["waveform"].shape[-1] > 0 for c in clips)
    assert ("batching 'static' is retired" in caplog.text) == (batching == "static")
    with pytest.raises(ValueError, match="^Qwen3-TTS Render Lines: batching must be one of continuous, static, "
                                         "got 'paged'"):
        render(nodes, base_model, bank, batching="paged")



def test_the_retired_batching_warning_is_shown_on_the_node(nodes, comfy, base_model, bank, tmp_path, caplog):
    """morph/render.py retired_batching words it; the node shows the same record the log gets, above the progress."""
    comfy.modules["folder_paths"].get_output_directory = lambda: str(tmp_path / "comfy_output")
    comfy.node_id, comfy.texts[:] = "5", []
    with caplog.at_level(logging.INFO):
        render(nodes, base_model, bank, script="Alice: Hi.", batching="static")
    warned, = [r.getMessage() for r in caplog.records if "batching 'static' is retired" in r.getMessage()]
    assert warned.startswith("Qwen3-TTS Render Lines: batching 'static' is retired and goes in the next release")
    texts = [text for node, text in comfy.texts if node == "5"]
    assert texts and all(text.split("\n")[0] == f"Warning: {warned}" for text in texts)
    comfy.texts[:] = []
    render(nodes, base_model, bank, script="Alice: Hi.", batching="continuous")
    assert not any("retired" in text for _, text in comfy.texts)

def test_smoothing_normalises_each_line(nodes, base_model, bank, out_dir):
    clips, _, _ = render(nodes, base_model, bank, script="Alice: One.\nBob: Two.", smoothing=True)
    for clip in clips:
        assert abs(float(clip["waveform"].abs().max()) - 10 ** (-3 / 20)) < 1e-3


def test_script_and_input_errors_name_the_node(nodes, base_model, bank, out_dir):
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Render Lines: the script has problems: line 2: unknown "
                                         r"character 'Carol'.*Known characters: Alice, Bob"):
        render(nodes, base_model, bank, script="Alice: Hi.\nCarol: Who?")
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Render Lines: the script has problems: "
                                         r"line 1 \('no colon here'\) does not start with 'Name:'"):
        render(nodes, base_model, bank, script="no colon here")
    with pytest.raises(ValueError, match=r"^Qwen3-TTS Render Lines: bank is empty"):
        render(nodes, base_model, {}, script="Alice: Hi.")
    for prefix in ("../escape", "/abs/path", "  "):
        with pytest.raises(ValueError, match=r"^Qwen3-TTS Render Lines: filename_prefix .* must be a relative name"):
            render(nodes, base_model, bank, script="Alice: Hi.", resume=True, filename_prefix=prefix)


def test_progress_counts_frames_across_batches_and_cancel_lands_within_one_step(nodes, comfy, base_model, bank,
                                                                                tmp_path):
    comfy.modules["folder_paths"].get_output_directory = lambda: str(tmp_path / "comfy_output")
    render(nodes, base_model, bank, do_sample=False, subtalker_do_sample=False, filename_prefix="first/take")
    values, totals = [v for v, _ in comfy.progress], {t for _, t in comfy.progress}
    assert totals == {(2 + 2 + 1) * 4}  # batches of 2, 2 and 1 lines, max_new_tokens 4: 4 frame steps
    assert values == sorted(values) and values[-1] == totals.pop()

    checks = comfy.interrupt_checks
    comfy.interrupt_at = checks + 6  # the run's first check is before loading; then one per step
    mm = comfy.modules["comfy.model_management"]
    with pytest.raises(mm.InterruptProcessingException):
        render(nodes, base_model, bank, resume=True)
    assert comfy.interrupt_checks == checks + 6
    written = sorted(p.name for p in (tmp_path / "comfy_output" / "scene").glob("take_*.wav"))
    assert len(written) == 2, "the first batch's lines stay on disk after a cancel"



def test_a_stopped_render_says_on_the_node_how_many_lines_the_folder_keeps(nodes, comfy, base_model, bank, tmp_path,
                                                                           caplog):
    """After a Cancel or an API interrupt (ComfyUI raises both between frames) the progress line, which would go on
    reading its last time left, becomes the lines kept: what the line store recorded, not the progress tally."""
    comfy.modules["folder_paths"].get_output_directory = lambda: str(tmp_path / "comfy_output")
    script = "\n".join(f"{name}: Line number {i}, {name} speaking." for i, name in
                       enumerate(["Alice", "Bob"] * 4, start=1))
    caplog.set_level(logging.INFO)  # ComfyUI's default log level
    comfy.node_id, comfy.texts[:] = "9", []
    comfy.interrupt_at = comfy.interrupt_checks + 10  # the check before loading, then one per frame step
    with pytest.raises(comfy.modules["comfy.model_management"].InterruptProcessingException):
        render(nodes, base_model, bank, script=script, do_sample=False, subtalker_do_sample=False, resume=True)
    folder = tmp_path / "comfy_output" / "scene"
    kept = len(list(folder.glob("take_*.wav")))
    assert 0 < kept < 8
    assert len(json.loads((folder / "take_lines.json").read_text())["lines"]) == kept
    texts = [text for node, text in comfy.texts if node == "9"]
    assert texts[-1] == (f"Qwen3-TTS Render Lines: stopped: {kept} of 8 lines kept; queue it again with resume on "
                         "to render the rest")

    comfy.texts[:] = []  # a rerun keeps what it reuses in the count when it stops too
    comfy.interrupt_at = comfy.interrupt_checks + 2
    with pytest.raises(comfy.modules["comfy.model_management"].InterruptProcessingException):
        render(nodes, base_model, bank, script=script, do_sample=False, subtalker_do_sample=False, resume=True)
    assert len(list(folder.glob("take_*.wav"))) == kept
    assert comfy.texts[-1][1].split("\n")[-1].startswith(f"Qwen3-TTS Render Lines: stopped: {kept} of 8 lines kept; ")

def test_resume_after_a_crash_renders_only_the_missing_lines(nodes, base_model, bank, out_dir, batch_nodes,
                                                             monkeypatch):
    engine = sys.modules[batch_nodes.__name__.rsplit(".nodes.", 1)[0] + ".morph.render"].BatchTTS
    real = engine._generate
    rows = []

    def crash_on_second_batch(self, batch, *args):
        rows.append(len(batch))
        if len(rows) == 2:
            raise RuntimeError("simulated crash")
        return real(self, batch, *args)

    monkeypatch.setattr(engine, "_generate", crash_on_second_batch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        render(nodes, base_model, bank, resume=True)
    first = line_files(out_dir)
    assert len(first) == 2 and all(re.fullmatch(r"take_\d{4}_(Alice|Bob)\.wav", f) for f in first)
    kept = {f: (out_dir / "scene" / f).read_bytes() for f in first}

    rows.clear()
    monkeypatch.setattr(engine, "_generate", lambda self, *a: rows.append(len(a[0])) or real(self, *a))
    clips, dialogue, srt = render(nodes, base_model, bank, resume=True)
    assert sum(rows) == len(SPOKEN) - 2, "only the three missing lines are rendered"
    assert len(clips) == len(SPOKEN) and srt.count(" --> ") == len(SPOKEN)
    files = line_files(out_dir)
    assert files == [f"take_{i:04d}_{name}.wav" for i, (name, _) in enumerate(SPOKEN, start=1)]
    assert all((out_dir / "scene" / f).read_bytes() == data for f, data in kept.items())
    import soundfile

    for f, clip in zip(files, clips, strict=True):  # the outputs are the files, bit for bit (float WAV)
        wav, rate = soundfile.read(str(out_dir / "scene" / f), dtype="float32")
        assert rate == SR and np.array_equal(wav, clip["waveform"][0, 0].numpy())
    manifest = json.loads((out_dir / "scene" / "take_lines.json").read_text())
    assert manifest["lines"]["0003"]["text"] == "It sounded like footsteps."
    assert list(manifest["lines"]) == [f"{i:04d}" for i in range(1, len(SPOKEN) + 1)], "script order"

    rows.clear()
    again = render(nodes, base_model, bank, resume=True, seed=99)  # a new seed alone does not re-render
    assert rows == [] and all(torch.equal(a["waveform"], b["waveform"]) for a, b in zip(again[0], clips, strict=True))

    rows.clear()
    edited = SCRIPT.replace("Only the wind.", "Only the wind, I promise.")
    render(nodes, base_model, bank, script=edited, resume=True)
    assert rows == [1], "an edited line is rendered again, the others are reused"


def test_what_a_resumed_render_reuses_and_redoes_is_said_on_the_node_in_one_line(nodes, comfy, base_model, bank,
                                                                                out_dir, caplog):
    render(nodes, base_model, bank, resume=True)
    comfy.node_id, comfy.texts[:] = "8", []
    with caplog.at_level(logging.INFO):  # ComfyUI's default log level
        render(nodes, base_model, bank, resume=True, top_k=7)  # a setting changed: every line is rendered again
    texts = [text for node, text in comfy.texts if node == "8"]
    n = len(SPOKEN)
    assert texts and texts[0].startswith(f"Qwen3-TTS Render Lines: 0 of {n} lines already rendered in ")
    assert texts[0].endswith(f" (rendering again: {n} from another text, voice, model or settings); rendering {n}")
    assert all("rendering it again" not in text for text in texts)  # not a line per file


def test_render_lines_reports_lines_audio_and_speed_on_the_node_and_in_the_log(nodes, comfy, base_model, bank,
                                                                              out_dir, caplog):
    """What cli.py render prints (morph/progress.py): the node's text and ComfyUI's log end with the final counts."""
    comfy.node_id, comfy.texts[:] = "9", []
    with caplog.at_level(logging.INFO):  # ComfyUI's default log level
        render(nodes, base_model, bank)
    n = len(SPOKEN)
    reports = [r.getMessage() for r in caplog.records if getattr(r, "progress", False)]
    assert reports[0].startswith(f"Qwen3-TTS Render Lines: 0 of {n} lines | 0.0 s of audio | ")
    assert reports[-1].startswith(f"Qwen3-TTS Render Lines: {n} of {n} lines | ") and " | took 0:" in reports[-1]
    texts = [text for node, text in comfy.texts if node == "9"]
    assert texts[-1] == reports[-1], "the last progress line stays on the node"


def test_the_manifest_is_in_script_order_even_while_lines_finish_longest_first(nodes, base_model, bank, out_dir):
    script = "Alice: Hi.\nBob: This line is quite a lot longer than the first one.\nAlice: Mid length line."
    render(nodes, base_model, bank, script=script, batch_size=1, resume=True)
    manifest = json.loads((out_dir / "scene" / "take_lines.json").read_text())
    assert list(manifest["lines"]) == ["0001", "0002", "0003"]
    render(nodes, base_model, bank, script="Alice: Hi.", resume=True)  # a shorter script: its lines only
    assert list(json.loads((out_dir / "scene" / "take_lines.json").read_text())["lines"]) == ["0001"]


def test_a_second_render_into_a_prefix_in_use_is_refused_and_the_first_keeps_its_files(nodes, base_model, bank,
                                                                                      out_dir, batch_nodes):
    """Two ComfyUI servers (or a server and `cli.py render`) on one output folder and prefix: the second is told
    who holds it and renders nothing; the first job's lines stay its own."""
    render(nodes, base_model, bank, resume=True)
    first = {f: (out_dir / "scene" / f).read_bytes() for f in line_files(out_dir)}
    store = sys.modules[batch_nodes.__name__.rsplit(".", 2)[0] + ".morph.lines.store"]
    with store.LineStore(out_dir, "scene/take", "cli.py render", what="cli.py render scene.txt"):
        with pytest.raises(RuntimeError, match=r"^Qwen3-TTS Render Lines: another job is writing these files \(cli.py "
                                               r"render scene.txt, process \d+ on .+\); wait for it to finish, or give "
                                               r"this one another output folder or prefix$"):
            render(nodes, base_model, bank, resume=False, top_k=7)
    assert {f: (out_dir / "scene" / f).read_bytes() for f in line_files(out_dir)} == first
    render(nodes, base_model, bank, resume=False, top_k=7)  # free again once the other job let go


@pytest.mark.parametrize("change", ["dtype", "attention", "mode", "settings"])
def test_the_fingerprint_covers_dtype_attention_decode_mode_and_every_setting(nodes, base_model, batch_nodes, change,
                                                                             monkeypatch):
    pack = batch_nodes.__name__.rsplit(".", 2)[0]
    split = sys.modules[pack + ".nodes.common"].split_generation_options
    settings = split(gen_options())[1]
    job, store = sys.modules[pack + ".morph.script_job"], sys.modules[pack + ".morph.lines.store"]

    def fingerprint(model=base_model, settings=settings):
        context = job.job_context(model.tts.config, "English", settings, True)
        return store.fingerprint(context, "Alice", "Hello.", voice)

    voice = type("V", (), {"spk_embedding": torch.zeros(4), "ref_code": None, "ref_text": None})()
    before = fingerprint()
    engine = base_model.tts
    if change != "settings":
        changed = {"dtype": torch.float16, "attention": "eager", "mode": "graphs"}[change]
        monkeypatch.setattr(engine, "config", dataclasses.replace(engine.config, **{change: changed}))
    else:
        assert fingerprint(settings=split(gen_options(seed=12345))[1]) == before, "the seed does not count"
        settings = split(gen_options(subtalker_top_k=7))[1]
        assert fingerprint(settings=settings) != before
        return
    assert fingerprint() != before


# -- the workflow -------------------------------------------------------------------------------------
def test_character_lines_workflow(pack, batch_nodes):
    info = wt.combined_object_info(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS)
    wf = json.loads((ROOT / "workflows" / "Character lines.json").read_text())
    assert wt.check_ui_workflow(wf, info) == []
    prompt = wt.ui_to_api(wf, info)
    assert wt.validate_prompt(prompt, info) == []
    by_type = {}
    for node_id, node in prompt.items():
        by_type.setdefault(node["class_type"], []).append((node_id, node))
    assert len(by_type["LoadAudio"]) == 2 and len(by_type["Qwen3TTSMorphVoicePrompt"]) == 2
    banks = by_type[BANK]
    assert len(banks) == 2 and sum("bank" in n["inputs"] for _, n in banks) == 1
    (render_id, render_node), = by_type[RENDER]
    names = [n["inputs"]["name"] for _, n in banks]
    from importlib import import_module

    script = import_module(pack.__name__ + ".morph.lines.script")
    lines = script.parse_script(render_node["inputs"]["script"], names)
    assert len(lines) == 10 and {line.name for line in lines} == set(names)
    # one audio file per line (Render Lines' own WAVs): the lines are previewed, only the dialogue is saved
    assert [n["inputs"]["audio"] for _, n in by_type["SaveAudioAdvanced"]] == [[render_id, 1]]
    assert [n["inputs"]["audio"] for _, n in by_type["PreviewAudio"]] == [[render_id, 0]]
    assert render_node["inputs"]["resume"] is True
