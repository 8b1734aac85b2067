"""The runs, each through ComfyUI's HTTP API as the frontend queues them: every workflow, a Render Lines
job, an /interrupt in mid-generation and a rerun, generations in a row, a load-generate-unload cycle, and the
same cycle in a fresh server in speed_mode eager; and the prompt edits they make."""

from __future__ import annotations

import time
from pathlib import Path

from .report import vram_check
from .server import Server, rejected, settle_vram, vram

# Sentences for the Render Lines job: 40-80 characters, the length of a typical dialogue line.
SENTENCES = [
    "Did you hear that? Something moved in the garden.",
    "It's only the wind. Go back to sleep.",
    "The lamp by the gate went out a minute ago, all by itself.",
    "Lamps do that when the bulb is old. I will change it tomorrow.",
    "Then why is the gate open? I closed it after dinner.",
    "Maybe the neighbour's cat pushed it. It is a very strong cat.",
    "I am going to look. Hand me the torch from the drawer.",
    "Fine, but put your boots on. The grass is wet.",
]



def find(prompt: dict, class_type: str) -> list[tuple[str, dict]]:
    return [(k, n) for k, n in prompt.items() if n["class_type"] == class_type]


def with_defaults(prompt: dict, info: dict) -> dict:
    """Fill required widget inputs a workflow does not set (a node gained an input) with their defaults."""
    for node in prompt.values():
        spec = info.get(node["class_type"], {})
        for name, value in spec.get("input", {}).get("required", {}).items():
            if name not in node["inputs"] and len(value) > 1 and isinstance(value[1], dict) and "default" in value[1]:
                node["inputs"][name] = value[1]["default"]
    return prompt


def capped(prompt: dict, frames: int | None) -> dict:
    if frames is not None:
        for node in prompt.values():
            if "max_new_tokens" in node["inputs"]:
                node["inputs"]["max_new_tokens"] = frames
    return prompt


def script_of(names: list[str], count: int) -> str:
    return "\n".join(f"{names[i % len(names)]}: {SENTENCES[i % len(SENTENCES)]}" for i in range(count))


def run_workflows(server: Server, ui: dict, info: dict, wt, args, report: dict, save) -> None:
    """Every workflow, as the frontend would queue it, into report["workflows"] (saved after each)."""
    for name, wf in ui.items():
        if budget(args) < 10:
            report.setdefault("workflows", {})[name] = {"status": "skipped", "reason": "deadline", "wall_s": 0}
            continue
        prompt = capped(with_defaults(wt.ui_to_api(wf, info), info), args.max_new_tokens)
        result = server.queue(prompt, budget(args))
        result["outputs"] = outputs_of(server, result.get("prompt_id"))
        print(f"workflow {name}: {result['status']} in {result['wall_s']} s", flush=True)
        report.setdefault("workflows", {})[name] = result
        report["steps"].setdefault("workflows_s", 0)
        report["steps"]["workflows_s"] += result["wall_s"]
        save()


def workflow_with(ui: dict, info: dict, wt, node_type: str) -> dict | None:
    """The API prompt of the first workflow that holds a node of `node_type`, or None."""
    return next((wt.ui_to_api(wf, info) for wf in ui.values() if any(n["type"] == node_type for n in wf["nodes"])),
                None)


def lines_prompt(ui: dict, info: dict, wt, lines: int, batch_size: int, job: int = 0) -> dict | None:
    """The dialogue workflow's graph with a Render Lines script of `lines` lines in batches of `batch_size` (its
    retired `batching` left as the workflow has it: the speed mode decides how a render batches); the `job`-th of a
    run has a seed of its own, so that ComfyUI renders a batch size given twice again rather than from its cache."""
    base = workflow_with(ui, info, wt, "Qwen3TTSMorphRenderLines")
    if base is None:
        return None
    prompt = with_defaults(base, info)
    names = [n["inputs"]["name"] for _, n in find(prompt, "Qwen3TTSMorphVoiceBank")]
    for _, node in find(prompt, "Qwen3TTSMorphRenderLines"):
        node["inputs"].update(script=script_of(names, lines), batch_size=batch_size,
                              filename_prefix=f"comfy_gpu_run/lines{job}_b{batch_size}", seed=7 + job,
                              resume=False)
    return prompt


def render_lines(server: Server, ui: dict, info: dict, wt, args) -> list[dict]:
    """A Render Lines job of --lines lines at each of --batch-sizes, from the dialogue workflow's graph."""
    jobs = []
    for job, size in enumerate(args.batch_sizes):
        prompt = lines_prompt(ui, info, wt, args.lines, size, job)
        if prompt is None or budget(args) < 30:
            jobs.append({"status": "skipped", "lines": args.lines, "batch_size": size,
                         "reason": "deadline" if prompt else "no Render Lines workflow"})
            continue
        result = server.queue(capped(prompt, args.max_new_tokens), budget(args))
        result.update(lines=args.lines, batch_size=size, outputs=outputs_of(server, result.get("prompt_id")))
        print(f"render lines x{args.lines} batch {size}: {result['status']} in {result['wall_s']} s", flush=True)
        jobs.append(result)
    return jobs


def over_max(server: Server, ui: dict, info: dict, wt, args) -> dict:
    """A Render Lines prompt with batch_size one over the node's max: ComfyUI must refuse it at /prompt, and
    the run must record its reasons (status "rejected") and go on."""
    spec = info.get("Qwen3TTSMorphRenderLines", {}).get("input", {}).get("required", {}).get("batch_size", [None, {}])
    size = spec[1].get("max", 64) + 1
    prompt = lines_prompt(ui, info, wt, 4, size)
    if prompt is None:
        return {"status": "skipped", "reason": "no Render Lines workflow"}
    result = server.queue(prompt, budget(args))
    result.update(batch_size=size, expected="rejected")
    print(f"batch_size {size} (over the max): {result['status']}", flush=True)
    return result


def cloning_prompt(ui: dict, info: dict, wt) -> dict | None:
    """The plainest cloning graph: the fewest nodes with Load Audio -> Voice Prompt -> Generate."""
    cloning = [wf for wf in ui.values() if {"LoadAudio", "Qwen3TTSMorphVoicePrompt", "Qwen3TTSMorphGenerate"}
               <= {x["type"] for x in wf["nodes"]}]
    return wt.ui_to_api(min(cloning, key=lambda wf: len(wf["nodes"])), info) if cloning else None


def outputs_of(server: Server, pid: str | None) -> dict:
    """How many files each output node wrote, from /history."""
    if not pid:
        return {}
    try:
        hist = server.get(f"/history/{pid}").get(pid, {})
    except Exception as e:
        return {"error": repr(e)}
    return {node: {k: len(v) for k, v in out.items() if isinstance(v, list)} for node, out in hist.get("outputs", {}).items()}


def budget(args) -> float:
    """Seconds a prompt may still take: its own limit, or what is left before the deadline."""
    return max(0.0, min(args.prompt_timeout, args.deadline_at - time.time()))


def interrupt_test(server: Server, prompt: dict, args) -> dict:
    """Queue a long generation, POST /interrupt once it is some frames in, time the stop, then rerun."""
    gen_id, gen = find(prompt, "Qwen3TTSMorphGenerate")[0]
    # About 2,000 frames at most: long enough to be interrupted, whatever the speed.
    gen["inputs"].update(text=" ".join(SENTENCES * 3)[:450], seed=12345, max_new_tokens=0)
    mark = len(server.messages)
    answer = server.post("/prompt", {"prompt": prompt, "client_id": server.client_id})
    refused = rejected(answer)
    if refused is not None:
        return refused
    pid = answer["prompt_id"]

    def generating(m):
        d = m.get("data", {})
        return m["type"] == "progress" and d.get("prompt_id") == pid and d.get("node") == gen_id and d.get("value", 0) >= 20

    seen = server.wait_for(generating, budget(args), mark)
    if seen is None:
        return {"status": "never reached frame 20", "messages": [m["type"] for _, m in server.messages[mark:]][-20:]}
    t0 = time.time()
    server.post("/interrupt", {})
    stop = server.wait_for(lambda m: m.get("data", {}).get("prompt_id") == pid and m["type"] in (
        "execution_interrupted", "execution_error", "execution_success"), 120, mark)
    result = {"interrupted_at_frame": seen[2]["data"]["value"], "of_frames": seen[2]["data"].get("max")}
    if stop is None:
        result.update(status="did not stop within 120 s")
        return result
    result.update(status=stop[2]["type"], latency_s=round(stop[1] - t0, 3))
    gen["inputs"].update(seed=54321, text=SENTENCES[0], max_new_tokens=args.run_frames)
    rerun = server.queue(prompt, budget(args))
    result["rerun"] = {k: rerun.get(k) for k in ("status", "wall_s", "node_times", "error")}
    return result


def repeated_runs(server: Server, prompt: dict, args, spid) -> dict:
    gen = find(prompt, "Qwen3TTSMorphGenerate")[0][1]
    gen["inputs"].update(text=SENTENCES[2], max_new_tokens=args.run_frames)
    runs = []
    for i in range(args.runs):
        if budget(args) < 10:
            break
        gen["inputs"]["seed"] = 1000 + i
        r = server.queue(prompt, budget(args))
        mem = vram(server, spid, args.cpu)
        runs.append({"status": r["status"], "wall_s": r["wall_s"],
                     "generate_s": next((n["s"] for n in r.get("node_times", []) if n["class_type"] == "Qwen3TTSMorphGenerate"), None),
                     "vram": mem, **({"error": r["error"]} if "error" in r else {})})
    keys = ("process_mib", "torch_reserved_mib")
    growth = {}
    for key in keys:
        values = [r["vram"].get(key) for r in runs if r["vram"].get(key) is not None]
        if len(values) > 1:
            growth[key] = {"first": values[0], "last": values[-1], "max": max(values), "growth_after_first": values[-1] - values[0]}
    walls = sorted(r["generate_s"] for r in runs if r["generate_s"] is not None)
    return {"runs": runs, "runs_requested": args.runs, "frames_each_at_most": args.run_frames, "growth": growth,
            "all_success": len(runs) == args.runs and all(r["status"] == "success" for r in runs),
            "generate_s_median": walls[len(walls) // 2] if walls else None}


def generate_and_unload(server: Server, pid, prompt: dict, seed: int, args) -> dict:
    """One generation (loading the model if it is not), then "Unload models": the run and the VRAM
    while loaded and after unloading."""
    find(prompt, "Qwen3TTSMorphGenerate")[0][1]["inputs"].update(text=SENTENCES[2], seed=seed,
                                                                  max_new_tokens=args.run_frames)
    run = server.queue(prompt, budget(args))
    result = {"run": {k: run.get(k) for k in ("status", "wall_s", "node_times", "error")},
              "loaded": vram(server, pid, args.cpu)}
    server.post("/free", {"unload_models": True})
    result["after_unload_models"] = settle_vram(server, pid, args.cpu)
    return result


def eager_control(cmd: list[str], comfy: Path, out: Path, args, prompt: dict) -> dict:
    """VRAM before loading, loaded and after "Unload models" around one generation in speed_mode eager:
    with no CUDA graph and no fused decoder in the process, what stays after unloading is not theirs."""
    control = Server(f"http://127.0.0.1:{args.port + 1}")
    try:
        control.start(cmd, comfy, out / "server_control.log")
        pid = control.proc.pid
        result = {"baseline": settle_vram(control, pid, args.cpu, 5)}
        for _, node in find(prompt, "Qwen3TTSMorphLoadModel"):
            node["inputs"]["speed_mode"] = "eager"
        result.update(generate_and_unload(control, pid, prompt, 1, args))
        result["check"] = vram_check(result)
        return result
    finally:
        control.stop()
