"""tools/comfy_gpu_run.py's pieces that need no ComfyUI or GPU: the wheel manifest, per-node times from the
websocket messages, the prompt edits, and the VRAM verdict. The run itself is checked by running it
(`--cpu --size tiny` here, on the GPU device machine for real)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("comfy_gpu_run", ROOT / "tools" / "comfy_gpu_run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def manifest():
    return run.read_manifest(ROOT / "tools" / "device_wheels.txt")


def test_manifest_pins_one_version_of_each_wheel():
    sections = manifest()
    assert set(sections) == {"server", "pack", "tools", "peers"}
    specs = [s for entries in sections.values() for s in entries]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.]+", s) for s in specs), specs
    names = [norm(s.split("==")[0]) for s in specs]
    assert len(names) == len(set(names)), "two versions of one package stop the offline install"
    assert "qwen-tts==0.1.1" in sections["pack"]


def test_manifest_brings_every_requirement_the_device_lacks():
    device = {norm(line.split("==")[0]) for line in (ROOT / "tests" / "fixtures" / "device_packages.txt").read_text()
              .splitlines() if line and not line.startswith("#")}
    carried = {norm(s.split("==")[0]) for s in manifest()["pack"]}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name = norm(re.split(r"[<>=!~ ;\[]", line)[0])
            assert name in device or name in carried, f"{name}: neither on the device nor in [pack]"
    assert not carried & device, "carried wheels would replace the device's own packages"


def test_node_times_come_from_consecutive_executing_messages():
    server = run.Server("http://127.0.0.1:1")
    msg = lambda t, node: (t, {"type": "executing", "data": {"node": node, "prompt_id": "p"}})  # noqa: E731
    server.messages = [
        (0.5, {"type": "execution_cached", "data": {"nodes": ["1"], "prompt_id": "p"}}),
        msg(1.0, "2"), (1.5, {"type": "progress", "data": {"node": "2", "prompt_id": "p"}}),
        msg(3.0, "3"), msg(3.25, None),
        (4.0, {"type": "executing", "data": {"node": "9", "prompt_id": "other"}}),  # another prompt's: ignored
    ]
    prompt = {"2": {"class_type": "Gen"}, "3": {"class_type": "Save"}}
    times = server.node_times("p", prompt, 0, 3.25)
    assert times == {"node_times": [{"node": "2", "class_type": "Gen", "s": 2.0},
                                    {"node": "3", "class_type": "Save", "s": 0.25}], "cached": ["1"]}


def test_prompt_edits():
    info = {"Gen": {"input": {"required": {"text": ["STRING", {"default": "hi"}], "model": ["MODEL"]}}}}
    prompt = {"1": {"class_type": "Gen", "inputs": {"max_new_tokens": 0}}}
    run.with_defaults(prompt, info)
    assert prompt["1"]["inputs"] == {"max_new_tokens": 0, "text": "hi"}
    assert run.capped(prompt, 30)["1"]["inputs"]["max_new_tokens"] == 30
    assert run.script_of(["A", "B"], 3).splitlines()[2].startswith("A: ")


def test_vram_verdict_is_64_mib_above_the_baseline():
    ok = run.vram_check({"baseline": {"process_mib": 500}, "after_unload_models": {"process_mib": 564}})
    bad = run.vram_check({"baseline": {"process_mib": 500}, "after_unload_models": {"process_mib": 565}})
    assert ok["pass"] is True and bad["pass"] is False
    assert run.vram_check({"baseline": {}})["pass"] is None  # on CPU there is nothing to judge


def test_the_second_cycle_is_judged_from_where_it_started():
    v = {"baseline": {"process_mib": 500}, "after_unload_models": {"process_mib": 1000},
         "after_free_memory": {"process_mib": 900}, "second_cycle": {"after_unload_models": {"process_mib": 964}}}
    check = run.vram_check(v)
    assert check["pass"] is False and check["second_cycle.process_mib_above_its_start"] == 64
    assert check["second_cycle.pass"] is True
    v["second_cycle"]["after_unload_models"]["process_mib"] = 965
    assert run.vram_check(v)["second_cycle.pass"] is False


def test_the_text_a_node_shows_is_decoded_from_comfyuis_binary_message():
    # as server.PromptServer.send_progress_text packs it, behind send_sync's event type
    data = run.BINARY_TEXT + (2).to_bytes(4, "big") + b"12" + "morph: preparing the fused decoder…".encode()
    message = run.progress_text(data)
    assert message == {"type": "progress_text", "data": {"node": "12", "text": "morph: preparing the fused decoder…"}}
    server = run.Server("http://127.0.0.1:1")
    server.messages = [(0.0, {"type": "progress_text", "data": {"node": "3", "text": "old"}}), (1.0, message),
                       (2.0, {"type": "progress_text", "data": {"node": "12", "text": "ready"}})]
    assert server.node_texts(1) == {"12": "ready"}
