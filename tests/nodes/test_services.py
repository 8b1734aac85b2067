"""The ComfyUI seam (nodes/services.py, and nodes/managed.py behind it) with ComfyUI's services simulated:
folders, progress, cancel, and the memory manager (ModelPatcher + load_models_gpu + "Unload models")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from .conftest import gen_options

VC = "Qwen3TTSMorphGenerate"


@pytest.fixture(scope="module")
def services(pack):
    return sys.modules[pack.__name__ + ".nodes.services"]


@pytest.fixture(scope="module")
def managed(pack):
    return sys.modules[pack.__name__ + ".nodes.managed"]


@pytest.fixture
def comfy_models(comfy, models_root):
    """The fake ComfyUI's models/qwen3-tts, holding the tiny base model."""
    folder = Path(comfy.models_dir) / "qwen3-tts"
    folder.mkdir(parents=True)
    (folder / "tiny-base").symlink_to((models_root / "tiny-base").resolve(), target_is_directory=True)
    return folder


def load_under_comfy(nodes, device="auto", dtype="auto"):
    return nodes["Qwen3TTSMorphLoadModel"]().load(model="tiny-base", dtype=dtype, attention="sdpa", device=device)[0]


# -- folders ----------------------------------------------------------------------------------------
def test_without_comfyui_folders_come_from_the_environment(services, monkeypatch, tmp_path):
    monkeypatch.setenv("QWEN3TTS_MODELS_DIR", str(tmp_path / "m"))
    assert services.model_dirs() == [tmp_path / "m"]
    assert services.voices_save_dir() == tmp_path / "m" / "voices"
    monkeypatch.delenv("QWEN3TTS_MODELS_DIR")
    monkeypatch.chdir(tmp_path)  # the fallback is the pack's own folder, wherever the process runs
    from .conftest import ROOT

    assert services.model_dirs() == [ROOT / "models" / "qwen3-tts"]
    monkeypatch.delenv("QWEN3TTS_OUTPUT_DIR", raising=False)
    assert services.output_dir() == ROOT / "output"
    assert services.choose_devices("auto") == (None, None)
    services.check_interrupt()  # a no-op


def test_with_comfyui_the_folder_is_registered_and_extra_paths_come_first(services, comfy, tmp_path):
    extra = str(tmp_path / "extra" / "qwen3-tts")
    # extra_model_paths.yaml with is_default: true is applied before custom nodes load
    comfy.modules["folder_paths"].add_model_folder_path("qwen3-tts", extra, is_default=True)
    services.register_model_folder()
    services.register_model_folder()  # idempotent
    default = os.path.join(comfy.models_dir, "qwen3-tts")
    assert comfy.folders["qwen3-tts"] == [extra, default]
    assert services.download_dir() == Path(extra)
    assert services.voices_save_dir() == Path(extra) / "voices"
    for root, name in ((extra, "a"), (default, "b")):
        (Path(root) / name).mkdir(parents=True)
        (Path(root) / name / "config.json").write_text("{}")
    (Path(default) / "Qwen" / "Qwen3-TTS-12Hz-0.6B-Base").mkdir(parents=True)
    (Path(default) / "Qwen" / "Qwen3-TTS-12Hz-0.6B-Base" / "config.json").write_text("{}")
    (Path(default) / "voices").mkdir()
    (Path(default) / "voices" / "v.safetensors").write_bytes(b"")
    assert services.list_local_models() == ["a", "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "b"]
    assert services.list_voice_files() == ["v.safetensors"]
    assert services.find_voice_file("v.safetensors") == Path(default) / "voices" / "v.safetensors"
    assert services.find_voice_file("../voices/v.safetensors") is None


def test_registering_at_import_when_comfyui_is_present(pack, comfy):
    import importlib.util

    from .conftest import ROOT

    spec = importlib.util.spec_from_file_location("pack_with_comfy", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["pack_with_comfy"] = module
    try:
        spec.loader.exec_module(module)
        assert comfy.folders["qwen3-tts"] == [os.path.join(comfy.models_dir, "qwen3-tts")]
    finally:
        for name in [m for m in sys.modules if m == "pack_with_comfy" or m.startswith("pack_with_comfy.")]:
            del sys.modules[name]


# -- memory manager -----------------------------------------------------------------------------------
def test_load_model_wraps_every_weight_in_a_model_patcher(nodes, comfy, comfy_models):
    handle = load_under_comfy(nodes)
    patcher = handle.patcher
    assert patcher is not None and comfy.patchers == [patcher]
    weights = patcher.model
    assert weights.talker is handle.tts.tts.model
    assert weights.codec is handle.tts.tts.model.speech_tokenizer.model
    assert (patcher.load_device, patcher.offload_device) == (torch.device("cpu"), torch.device("cpu"))
    size = sum(t.nbytes for t in handle.tts.tts.model.state_dict().values()) + \
        sum(t.nbytes for t in handle.tts.tts.model.speech_tokenizer.model.state_dict().values())
    assert patcher.model_size() == size  # every weight counted, none twice
    assert weights.get_dtype() == torch.float32  # dtype auto on ComfyUI's CPU device


def test_each_generation_loads_through_comfyui_and_unload_models_offloads(nodes, comfy, comfy_models, base_voice,
                                                                          monkeypatch):
    handle = load_under_comfy(nodes)
    events = []
    real_to = type(handle.tts).to

    def spy_to(self, device):
        events.append(("to", torch.device(device)))
        return real_to(self, device)

    monkeypatch.setattr(type(handle.tts), "to", spy_to)
    mm = comfy.modules["comfy.model_management"]
    real_load = mm.load_models_gpu
    mm.load_models_gpu = lambda models, **kw: (events.append(("load", kw.get("force_full_load"))),
                                               real_load(models, **kw))
    first = len(comfy.progress)

    out = nodes[VC]().generate(model=handle, voice=base_voice, text="Loaded by ComfyUI.", **gen_options())[0]
    assert out["waveform"].shape[:2] == (1, 1)
    assert events[:2] == [("load", True), ("to", torch.device("cpu"))], "load before generating, then sync"
    assert comfy.loads[-1]["models"] == [handle.patcher]
    assert len(comfy.progress) > first

    events.clear()
    mm.unload_all_models()  # the "Unload models" button
    assert events == [("to", torch.device("cpu"))], "after offload the engine follows its weights"
    assert comfy.loaded == []

    nodes[VC]().generate(model=handle, voice=base_voice, text="And loaded again.", **gen_options())
    assert events[1:3] == [("load", True), ("to", torch.device("cpu"))]


def test_the_engine_is_made_ready_at_load_for_wider_runs_and_after_an_offload(nodes, comfy, comfy_models, base_voice,
                                                                              managed, pack, monkeypatch):
    api, memory = (sys.modules[f"{pack.__name__}.morph.{name}"] for name in ("api", "memory"))
    readied = []

    def spy_ready(tts, width, who):  # what MorphTTS.ready leaves where graphs replay (off CUDA it does nothing)
        readied.append((width, who, len(comfy.loads)))
        tts.ready_width = width

    monkeypatch.setattr(api.MorphTTS, "ready", spy_ready)
    monkeypatch.setattr(managed, "replays_graphs", lambda tts, device=None: True)
    handle = load_under_comfy(nodes)
    assert readied == [(1, "Qwen3-TTS Load Model", 1)], "at load, for one row, once ComfyUI has loaded the weights"
    lines = [(line.text, line.voice) for line in sys.modules[f"{pack.__name__}.morph.engine.runner"].ready_lines(
        handle.tts, 3)]
    ready_need = memory.working_memory(handle.tts, lines, memory.GenerationSettings(), 3, device=handle.load_device)
    bank = nodes["Qwen3TTSMorphVoiceBank"]().add("Alice", base_voice)[0]

    def render(batch_size):
        nodes["Qwen3TTSMorphRenderLines"]().render(
            model=handle, bank=bank, script="Alice: One.\nAlice: Two.", batch_size=batch_size, batching="continuous",
            pause_seconds=0.0, smoothing=False, resume=False, filename_prefix="ready/take",
            **gen_options(max_new_tokens=2))

    nodes[VC]().generate(model=handle, voice=base_voice, text="One row.", **gen_options(max_new_tokens=2))
    render(3)
    assert readied[1:] == [(3, "Qwen3-TTS Render Lines", 3)], "a wider run readies first, its render declared"
    assert comfy.loads[-1]["memory_required"] >= ready_need
    render(2)
    nodes[VC]().generate(model=handle, voice=base_voice, text="One row.", **gen_options(max_new_tokens=2))
    assert len(readied) == 2, "runs the engine is ready for ready nothing"
    comfy.modules["comfy.model_management"].unload_all_models()
    assert handle.tts.ready_width is None
    nodes[VC]().generate(model=handle, voice=base_voice, text="One row.", **gen_options(max_new_tokens=2))
    assert readied[2:] == [(1, "Qwen3-TTS Generate (Voice Clone)", 6)], "an offload released it: ready again"


def test_devices_are_named_as_comfyui_names_them(services, comfy):
    comfy.device, comfy.offload = torch.device("cuda", 1), torch.device("cuda", 1)  # e.g. --highvram
    assert services.choose_devices("auto") == ("cuda:1", "cuda:1")
    # with an index: ComfyUI's free_memory compares devices with ==, and cuda != cuda:1
    assert services.choose_devices("cuda") == ("cuda:1", "cpu")
    assert services.choose_devices("cpu") == ("cpu", "cpu")
    comfy.device = comfy.offload = torch.device("cpu")
    assert services.choose_devices("cpu") == ("cpu", "cpu")


def test_offload_releases_the_engines_device_state(nodes, comfy, comfy_models, base_voice, managed, monkeypatch):
    handle = load_under_comfy(nodes)
    nodes[VC]().generate(model=handle, voice=base_voice, text="Fill the caches.", **gen_options())
    released = []
    monkeypatch.setattr(managed, "release_engine_state", lambda tts: released.append(tts))
    comfy.modules["comfy.model_management"].unload_all_models()
    assert released == [handle.tts]
    handle.patcher.detach(unpatch_all=False)  # a patcher being garbage-collected: nothing moves
    assert released == [handle.tts]


def test_release_engine_state_prefers_the_engines_own_method(managed):
    calls = []

    class Part:
        def __init__(self, name):
            self.name = name

        def release(self):
            calls.append(self.name)

    class OldEngine:
        patch = type("P", (), {"loop": Part("loop"), "predictor": Part("predictor")})()

    managed.release_engine_state(OldEngine())
    assert calls == ["loop", "predictor"]

    class NewEngine(OldEngine):
        def release_device_state(self):
            calls.append("engine")

    calls.clear()
    managed.release_engine_state(NewEngine())
    assert calls == ["engine"]


# -- progress and cancel ------------------------------------------------------------------------------
def test_progress_moves_every_step_and_completes(nodes, comfy, base_model, base_voice):
    nodes[VC]().generate(model=base_model, voice=base_voice, text="Progress, please.",
                         **gen_options(max_new_tokens=5, do_sample=False, subtalker_do_sample=False))
    values = [v for v, _ in comfy.progress]
    totals = {t for _, t in comfy.progress}
    assert totals == {5} and len(comfy.bars) == 1  # a limit of 5 frames is 5 decode steps
    assert values[:-1] == list(range(1, len(values))), "one update per step, in order"
    assert values[-1] == 5, "the bar is filled at the end even when EOS comes early"
    assert comfy.interrupt_checks >= len(values) - 1 + 1, "a cancel check before every step"


def test_progress_total_is_the_text_bound_when_max_new_tokens_is_auto(nodes, comfy, base_model, base_voice,
                                                                     pack):
    settings = sys.modules[pack.__name__ + ".morph.settings"]
    text = "Auto bound."
    comfy.interrupt_at = 3  # only the reported total matters: stop after the first step
    with pytest.raises(comfy.modules["comfy.model_management"].InterruptProcessingException):
        nodes[VC]().generate(model=base_model, voice=base_voice, text=text, **gen_options(max_new_tokens=0))
    assert comfy.progress == [(1, settings.default_max_frames(text))]


def test_cancel_lands_within_one_step_and_propagates(nodes, comfy, base_model, base_voice):
    interrupt = comfy.modules["comfy.model_management"].InterruptProcessingException
    comfy.interrupt_at = 3  # check 1: before loading; 2: step 1; 3: step 2
    with pytest.raises(interrupt):
        nodes[VC]().generate(model=base_model, voice=base_voice, text="Stop me.", **gen_options(max_new_tokens=50))
    assert comfy.interrupt_checks == 3
    assert [v for v, _ in comfy.progress] == [1], "stopped before step 2 ran"
    # the next run is clean
    out = nodes[VC]().generate(model=base_model, voice=base_voice, text="Again.", **gen_options())[0]
    assert out["waveform"].numel() > 0


def test_cancel_before_start_skips_the_work(nodes, comfy, base_model, base_voice, ref_clip):
    interrupt = comfy.modules["comfy.model_management"].InterruptProcessingException
    comfy.interrupt_at = 1
    with pytest.raises(interrupt):
        nodes["Qwen3TTSMorphVoicePrompt"]().make(base_model, ref_clip, "", False)
    assert comfy.progress == []


# -- working memory -----------------------------------------------------------------------------------
def test_each_run_declares_its_working_memory_to_comfyui(nodes, comfy, comfy_models, base_voice, pack):
    memory = sys.modules[pack.__name__ + ".morph.memory"]
    handle = load_under_comfy(nodes)
    nodes[VC]().generate(model=handle, voice=base_voice, text="Short.", **gen_options())
    short = comfy.loads[-1]["memory_required"]
    # its frame limit follows its text (max_new_tokens 0): the declaration is made before the first frame, so the run
    # stops there (random weights never end a line, and rendering it whole took minutes of the suite)
    comfy.interrupt_at = comfy.interrupt_checks + 2
    with pytest.raises(comfy.modules["comfy.model_management"].InterruptProcessingException):
        nodes[VC]().generate(model=handle, voice=base_voice, text="A much longer line than that. " * 10,
                             **gen_options(max_new_tokens=0))
    long = comfy.loads[-1]["memory_required"]
    assert memory.WORKSPACE < short < long
    settings = sys.modules[pack.__name__ + ".nodes.common"].split_generation_options(gen_options())[1]
    assert short == memory.working_memory(handle.tts, [("Short.", base_voice)], settings)


def test_working_memory_counts_the_cache_per_row_and_one_bounded_codec_call(tiny_tts):
    from morph.codec.pieces import DECODE_ROW_FRAMES
    from morph.memory import CODEC_VALUES_PER_ROW_FRAME, UPSTREAM_CODEC_WORKSPACE, WORKSPACE, working_memory
    from morph.prompts import prompt_tokens, token_count
    from morph.settings import GenerationSettings, capacity_for

    settings = GenerationSettings(max_new_tokens=100)
    c = tiny_tts.tts.model.config.talker_config  # 2 layers, 2 kv heads, head dim 16, fp32
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    # prompt, frames and EOS: what upstream's cache reaches
    tokens = prompt_tokens("Hello there.", None, "", token_count(tiny_tts)) + 101
    state = tokens * kv + capacity_for(tokens) * 2 * c.hidden_size * 4  # the loop's hidden states: every slot
    codec_frame = CODEC_VALUES_PER_ROW_FRAME * 4  # fp32

    def need(lines, batch_size):
        return (working_memory(tiny_tts, [("Hello there.", None)] * lines, settings, batch_size) - WORKSPACE
                - UPSTREAM_CODEC_WORKSPACE)

    # one row: its cache slots and its own codec call (the codec outweighs this tiny model's prefill)
    assert need(1, 1) == state + 100 * codec_frame
    # a batch: the cache per row, the codec at most its budget whatever the batch
    for rows in (8, 64, 256):
        assert need(rows, rows) == rows * state + DECODE_ROW_FRAMES * codec_frame
    assert need(8, 64) == need(8, 8) == need(8, None)  # no more rows than lines; None: every row at once
    long = "A sentence of some length. " * 40  # over 500 characters: its segments are rows of one batch
    assert working_memory(tiny_tts, [(long, None)], settings) > working_memory(tiny_tts, [(long, None)], settings, 1)



def test_the_continuous_batch_counts_the_pages_of_its_widest_rows(tiny_tts):
    """A render on the engine: the pages the `batch_size` largest rows could reserve at once, the other
    buffers per slot, a prefill of up to `batch_size` rows and one live codec call, all at once: rows waiting
    for a slot cost the next group's prompt, built ahead on a stream of its own, and no more however many they are;
    a wider batch at least its pages."""
    from morph.memory import STREAM_WORKSPACE, working_memory
    from morph.prompts import PROMPT_OVERHEAD_TOKENS, prompt_tokens, token_count
    from morph.settings import KV_PAGE, GenerationSettings, pool_pages

    settings = GenerationSettings(max_new_tokens=100)
    c = tiny_tts.tts.model.config.talker_config  # fp32
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    row_need = len("Hello there.") + PROMPT_OVERHEAD_TOKENS + 100 + 1  # prompt, frames and EOS slot
    tiny_tts.patch.mode = "lean"
    try:
        def need(lines, batch_size):
            return working_memory(tiny_tts, lines, settings, batch_size)

        short = [("Hello there.", None)]
        for rows in (8, 32):
            waiting = need(short * (rows + 1), rows) - need(short * rows, rows)
            prompt = prompt_tokens("Hello there.", None, "", token_count(tiny_tts))
            assert waiting == rows * prompt * c.hidden_size * 4 + STREAM_WORKSPACE, rows
            assert need(short * (3 * rows), rows) == need(short * (rows + 1), rows)
            wider = need(short * 2 * rows, 2 * rows) - need(short * rows, rows)
            assert wider >= (pool_pages([row_need] * 2 * rows, 2 * rows) - pool_pages([row_need] * rows, rows)) * KV_PAGE * kv
    finally:
        tiny_tts.patch.mode = "auto"


def test_an_icl_voice_counts_its_reference_in_the_prompt_and_the_codec(tiny_tts):
    from morph.memory import working_memory
    from morph.settings import GenerationSettings

    rng = np.random.RandomState(0)
    clip = (0.3 * np.sin(np.arange(48000) / 9.0) + 0.01 * rng.randn(48000)).astype(np.float32)
    icl, xvec = tiny_tts.make_voice(clip, 24000, transcript="Some words."), tiny_tts.make_voice(clip, 24000)
    settings = GenerationSettings(max_new_tokens=20)
    assert working_memory(tiny_tts, [("Hi.", icl)], settings, 1) > working_memory(tiny_tts, [("Hi.", xvec)], settings, 1)


# -- messages on the node -----------------------------------------------------------------------------
def test_warnings_the_user_must_act_on_are_shown_on_the_node(nodes, comfy, comfy_models, base_voice):
    handle = load_under_comfy(nodes)
    comfy.node_id = "12"
    rate = 24000
    t = np.arange(35 * rate) / rate
    long_clip = {"waveform": torch.from_numpy((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32))[None, None],
                 "sample_rate": rate}
    nodes["Qwen3TTSMorphVoicePrompt"]().make(handle, long_clip, "", False)
    assert comfy.texts and comfy.texts[-1][0] == "12"
    assert "only its first 30 s are used" in comfy.texts[-1][1]

    comfy.texts.clear()
    voice = nodes["Qwen3TTSMorphVoicePrompt"]().make(handle, long_clip, "", False)[0]
    object.__setattr__(voice, "ref_text", "Say this.")  # a transcript equal to the text: a swap
    nodes[VC]().generate(model=handle, voice=voice, text="Say this.", **gen_options())
    assert any("the same as the voice's transcript" in text for _, text in comfy.texts)

    # fixed: the next clean run replaces the old warning, which the frontend would otherwise keep showing
    comfy.texts.clear()
    nodes[VC]().generate(model=handle, voice=voice, text="Something else.", **gen_options())
    assert comfy.texts == [("12", "No warnings in this run.")]
    comfy.texts.clear()
    nodes[VC]().generate(model=handle, voice=voice, text="Something else again.", **gen_options())
    assert comfy.texts == []  # nothing to replace: a clean node stays quiet


def test_a_speed_mode_the_device_cannot_run_is_said_on_load_model_at_every_load(nodes, comfy, comfy_models):
    comfy.node_id = "2"
    for _ in range(2):  # every load, not once per process
        comfy.texts.clear()
        nodes["Qwen3TTSMorphLoadModel"]().load(model="tiny-base", dtype="fp32", attention="sdpa", device="cpu",
                                               speed_mode="fused")
        assert comfy.texts and comfy.texts[-1][0] == "2"
        assert comfy.texts[-1][1].startswith("Warning: speed_mode: fused mode needs a CUDA GPU; on cpu it runs eager")
    comfy.texts.clear()
    nodes["Qwen3TTSMorphLoadModel"]().load(model="tiny-base", dtype="fp32", attention="sdpa", device="cpu",
                                           speed_mode="auto")
    assert not any("CUDA" in text for _, text in comfy.texts)


def test_save_voice_shows_where_it_saved(nodes, comfy, base_voice, models_root):
    comfy.node_id = "3"
    nodes["Qwen3TTSMorphSaveVoice"]().save(base_voice, "shown")
    assert comfy.texts[-1][0] == "3" and comfy.texts[-1][1].startswith("saved shown.safetensors in ")


def test_a_warning_from_another_thread_is_not_shown_on_the_node(services, comfy):
    import logging
    import threading

    with services.messages_on_node():
        other = threading.Thread(target=lambda: logging.getLogger(services.PACK_LOGGER).warning("not mine"))
        other.start()
        other.join()
        logging.getLogger(services.PACK_LOGGER + ".morph.api").warning("mine")
    assert comfy.texts == [("7", "Warning: mine")]
    logging.getLogger(services.PACK_LOGGER).warning("after the node")
    assert comfy.texts == [("7", "Warning: mine")]


def test_a_status_line_is_shown_on_the_node_and_plain_info_is_not(services, comfy, caplog):
    import logging

    logger = logging.getLogger(services.PACK_LOGGER + ".morph.decode.runner")
    with caplog.at_level(logging.INFO), services.messages_on_node():  # INFO: ComfyUI's default log level
        logger.info("morph: preparing the fused decoder, about 10 s", extra={"status": True})
        logger.info("an ordinary info line")
        logger.warning("mind this")
    assert comfy.texts == [("7", "morph: preparing the fused decoder, about 10 s"),
                           ("7", "morph: preparing the fused decoder, about 10 s\nWarning: mind this")]


# -- devices ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device, lacking", [("mps", "MPS needs an Apple-silicon Mac"), ("cuda", "no CUDA GPU")])
def test_load_model_refuses_a_device_this_machine_lacks(nodes, comfy, comfy_models, monkeypatch, device, lacking):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=f"^Qwen3-TTS Load Model: device '{device}' is not available: .*{lacking}.*"
                                         "choose auto or cpu"):
        load_under_comfy(nodes, device=device)
    assert comfy.patchers == [], "refused before anything loads"
