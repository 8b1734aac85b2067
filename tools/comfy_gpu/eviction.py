"""Memory pressure: a second model that ComfyUI must evict ours to load, then ours loaded back, in a fresh server
whose VRAM budget (ComfyUI's own --reserve-vram) holds one of the two models but not both. Run with ComfyUI's
defaults (DynamicVRAM where the version has it) and with --disable-dynamic-vram where that flag exists.

The sequence, one graph as a user builds it (our clone beside a 1.7B VoiceDesign model):
1. the clone chain alone, seed S: the reference take, on a model loaded without pressure;
2. both chains, the clone with another seed: the clone runs (cached model), then the VoiceDesign model loads and
   ComfyUI must evict ours, in part or whole, to fit it;
3. both chains, the clone with seed S again: ComfyUI loads ours back whole (unloading the other as needed) and
   the take must be the reference's, sample for sample.
ComfyUI's node cache keeps our Load Model output across the three prompts (same node, same inputs), so step 3
reloads the very model step 2 evicted, as a graph that holds both models does.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np

from .runs import SENTENCES, budget, capped, find, outputs_of, with_defaults
from .server import Server, vram

GIB = 1024 ** 3
# ComfyUI loads a model when free VRAM exceeds its size x 1.1 plus max(0.8 GiB, the node's memory_required) plus
# --reserve-vram (comfy/model_management.py: load_models_gpu, minimum_inference_memory). Reserving all but this much
# above the larger model's need leaves room for either model, never for both (ours holds more than this margin).
MARGIN_GIB = 2.0
MEMORY_LINES = re.compile(r"(?i)requested to load|loaded completely|loaded partially|unload|offload")


def reserve_gib(total_bytes: int, sizes: list[int]) -> float:
    """The --reserve-vram (GiB) that leaves room for the larger model and its run, not for two models."""
    return round(max(0.0, (total_bytes - 1.1 * max(sizes)) / GIB - 0.8 - MARGIN_GIB), 2)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors"))


def prefixed(prompt: dict, prefix: str) -> dict:
    """The API prompt with every node id (and every link to one) prefixed, to sit beside another graph's nodes."""
    out = {}
    for node_id, node in prompt.items():
        node = copy.deepcopy(node)
        node["inputs"] = {k: [prefix + v[0], v[1]] if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                          else v for k, v in node["inputs"].items()}
        out[prefix + node_id] = node
    return out


def memory_lines(log_path: Path, start: int) -> tuple[list[str], int]:
    """ComfyUI's model-management lines written to the log since byte `start`, and the new end."""
    text = log_path.read_text(errors="replace")
    return [line[:200] for line in text[start:].splitlines() if MEMORY_LINES.search(line)][:20], len(text)


def judged(second_loads: list[str], ours_again: list[str], active_mib: float | None, sizes: list[int]) -> dict:
    """Whether ComfyUI evicted ours to load the second model, and loaded ours back, from its log lines and torch's
    active memory once the second model ran. ComfyUI unloads only what it needs: "Unloaded partially" moves part of
    a model's weights to the CPU and keeps the model in its list (so loading it back logs no new "Requested to
    load"); a whole unload is a debug line, so it shows as less memory in use than both models' weights."""
    logged = any(re.search(r"(?i)unloaded partially|[1-9]\d* models unloaded", line) for line in second_loads)
    short = active_mib is not None and active_mib * 2**20 < sum(sizes)
    return {"evicted": logged or short, "loaded_back": any("loaded completely" in line for line in ours_again)}


def samples(comfy: Path, server: Server, pid: str, node: str):
    """The audio the Save node `node` wrote in prompt `pid`, decoded (the file's metadata names its prompt, so the
    bytes of two equal takes differ)."""
    import soundfile

    saved = server.get(f"/history/{pid}")[pid]["outputs"][node]["audio"][0]
    return soundfile.read(str(comfy / "output" / saved.get("subfolder", "") / saved["filename"]), dtype="float32")[0]


def eviction_test(cmd: list[str], comfy: Path, out: Path, args, clone: dict, design: dict, info: dict,
                  vram_total: int | None) -> dict:
    """Both variants (defaults; --disable-dynamic-vram where it exists), each in a fresh server."""
    models = comfy / "models" / "qwen3-tts"
    names = {"clone": find(clone, "Qwen3TTSMorphLoadModel")[0][1]["inputs"]["model"],
             "second": find(design, "Qwen3TTSMorphLoadModel")[0][1]["inputs"]["model"]}
    sizes = {k: folder_bytes(models / v.split("/")[-1]) for k, v in names.items()}
    cli_args = (comfy / "comfy" / "cli_args.py").read_text()
    has_flag = "--disable-dynamic-vram" in cli_args
    if "--cache-classic" in cli_args:
        # its default RAM-pressure cache, on a machine with RAM to spare, answers step 3 with step 1's outputs
        cmd = cmd + ["--cache-classic"]
    result = {"models": names, "model_bytes": sizes, "variants": {}}
    for variant, extra in (("defaults", []), ("disable_dynamic_vram", ["--disable-dynamic-vram"])):
        if extra and not has_flag:
            result["variants"][variant] = {"status": "not available in this ComfyUI"}
            continue
        if budget(args) < 60:
            result["variants"][variant] = {"status": "skipped"}
            continue
        result["variants"][variant] = one_variant(cmd + extra, comfy, out / f"server_eviction_{variant}.log", args,
                                                  clone, design, info, list(sizes.values()), vram_total)
    result["ok"] = all(v.get("ok", True) for v in result["variants"].values())
    return result


def one_variant(cmd: list[str], comfy: Path, log_path: Path, args, clone: dict, design: dict, info: dict,
                sizes: list[int], vram_total: int | None) -> dict:
    server = Server(f"http://127.0.0.1:{args.port + 2}")
    result: dict = {}
    try:
        if not args.cpu:
            result.update(reserve_vram_gib=reserve_gib(vram_total, sizes), vram_total_gib=round(vram_total / GIB, 1))
            cmd = cmd + ["--reserve-vram", str(result["reserve_vram_gib"])]
        result["server_cmd"] = " ".join(cmd[1:])
        server.start(cmd, comfy, log_path)
        pid = server.proc.pid
        alone = capped(with_defaults(copy.deepcopy(clone), info), args.run_frames)
        gen_id, gen = find(alone, "Qwen3TTSMorphGenerate")[0]
        gen["inputs"]["text"] = SENTENCES[1]
        save_node = find(alone, "SaveAudioAdvanced")[0][0] if find(alone, "SaveAudioAdvanced") else None
        other = prefixed(capped(with_defaults(copy.deepcopy(design), info), args.run_frames), "second_")
        steps, mark = [], 0
        for name, seed, graph in (("ours_alone", 777, alone), ("second_model_loads", 778, {**alone, **other}),
                                  ("ours_loaded_back", 777, {**alone, **other})):
            graph = copy.deepcopy(graph)
            graph[gen_id]["inputs"]["seed"] = seed
            run = server.queue(graph, budget(args))
            lines, mark = memory_lines(log_path, mark)
            steps.append({"step": name, "status": run["status"], "wall_s": run["wall_s"], "error": run.get("error"),
                          "executed": [n["class_type"] for n in run.get("node_times", [])],
                          "outputs": outputs_of(server, run.get("prompt_id")), "vram": vram(server, pid, args.cpu),
                          "memory_log": lines, "prompt_id": run.get("prompt_id")})
            if run["status"] != "success":
                break
        result["steps"] = steps
        done = len(steps) == 3 and all(s["status"] == "success" for s in steps)
        if done and save_node:
            first = samples(comfy, server, steps[0]["prompt_id"], save_node)
            again = samples(comfy, server, steps[2]["prompt_id"], save_node)
            same_shape = first.shape == again.shape
            result["audio_equal"] = bool(same_shape and np.array_equal(first, again))
            result["max_abs_diff"] = float(np.abs(first - again).max()) if same_shape else None
        if done and not args.cpu:
            result.update(judged(steps[1]["memory_log"], steps[2]["memory_log"],
                                 steps[1]["vram"].get("torch_active_mib"), sizes))
        result["ok"] = (done and result.get("audio_equal") is True and result.get("evicted") is not False
                        and result.get("loaded_back") is not False)
        return result
    finally:
        server.stop()
