"""The report: the VRAM verdict, whether the run passed, the server log lines a reader looks for first, and
the summary printed at the end (report.json holds everything)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def passed(report: dict) -> bool:
    """Every workflow succeeded, the Render Lines jobs and the rerun after /interrupt succeeded (or were
    skipped), ComfyUI refused the batch size over the max, the interrupt stopped the prompt, and every
    repeated run succeeded, and under memory pressure our model came back with the same take (or was skipped)."""
    return (all(r.get("status") == "success" for r in report.get("workflows", {}).values())
            and all(r.get("status") in ("success", "skipped") for r in report["render_lines"])
            and report["over_max"].get("status") in ("rejected", "skipped")
            and report["interrupt"].get("status") in ("execution_interrupted", "skipped")
            and report["interrupt"].get("rerun", {}).get("status", "success") == "success"
            and report["repeated"]["all_success"]
            and report.get("eviction", {}).get("ok", True))


def vram_check(v: dict) -> dict:
    """After unload, the process must be back within 64 MiB of its memory before the first load."""
    check = {"limit_mib": 64}
    for key in ("process_mib", "torch_reserved_mib", "torch_active_mib"):
        base = v.get("baseline", {}).get(key)
        for stage in ("after_unload_models", "after_free_memory"):
            after = v.get(stage, {}).get(key)
            if base is not None and after is not None:
                check[f"{stage}.{key}_above_baseline"] = round(after - base, 1)
    above = check.get("after_unload_models.process_mib_above_baseline")
    check["pass"] = None if above is None else above <= 64
    cycle, before = v.get("second_cycle", {}).get("after_unload_models", {}), v.get("after_free_memory", {})
    if cycle.get("process_mib") is not None and before.get("process_mib") is not None:
        check["second_cycle.process_mib_above_its_start"] = cycle["process_mib"] - before["process_mib"]
        check["second_cycle.pass"] = check["second_cycle.process_mib_above_its_start"] <= 64
    return check


def log_findings(path: Path) -> dict:
    """The lines of the server log a reader looks for first."""
    text = path.read_text(errors="replace") if path.exists() else ""
    pick = lambda pattern: [line[:300] for line in text.splitlines() if re.search(pattern, line)][:30]  # noqa: E731
    return {"device_and_allocator": pick(r"^Device:|cudaMallocAsync|PYTORCH_CUDA_ALLOC_CONF|pytorch version"),
            "custom_node_import": pick(r"comfyui-qwen3-tts-morph|IMPORT FAILED"),
            "morph": pick(r"morph[:.]|Qwen3-TTS"),
            "errors": pick(r"Traceback|Error|error:|terminate called|Aborted|CUDA error")}


def print_summary(report: dict) -> None:
    print(f"commit {report.get('commit')}  torch {report.get('torch')}  transformers {report.get('transformers')}")
    for line in report.get("server_log_findings", {}).get("device_and_allocator", [])[:3]:
        print("  " + line)
    for name, r in report.get("workflows", {}).items():
        times = ", ".join(f"{n['class_type']} {n['s']:.2f}" for n in r.get("node_times", []))
        print(f"{name:24} {r['status']:11} {r.get('wall_s') or 0:7.2f} s  {times}  {r.get('error', '')}")
    for r in report.get("render_lines", []):
        print(f"render lines x{r.get('lines')} batch {r.get('batch_size')}: {r.get('status')}  wall {r.get('wall_s')}"
              f"  {r.get('error', '')}")
    if "over_max" in report:
        r = report["over_max"]
        print(f"batch_size {r.get('batch_size')} (over max): {r.get('status')}  {str(r.get('error', '')).splitlines()[-1:]}")
    if "interrupt" in report:
        r = report["interrupt"]
        print(f"interrupt                {r.get('status')}  wall {r.get('wall_s')}  latency {r.get('latency_s')}")
    if "repeated" in report:
        rep = report["repeated"]
        print(f"repeated x{len(rep['runs'])}: all success {rep['all_success']}, median generate "
              f"{rep['generate_s_median']} s, growth {json.dumps(rep['growth'])}")
    print("vram", json.dumps(report.get("vram", {}).get("check")))
    print("vram, eager control", json.dumps(report.get("vram_control_eager", {}).get("check")))
    for name, v in report.get("eviction", {}).get("variants", {}).items():
        walls = ", ".join(f"{s['step']} {s['status']} {s['wall_s']} s" for s in v.get("steps", []))
        print(f"eviction ({name}): {v.get('status', '')} evicted {v.get('evicted')}, same take {v.get('audio_equal')}"
              f"  {walls}")
    if report.get("fatal"):
        print("FATAL", report["fatal"][-800:])
    print(f"total {report.get('total_s')} s, ok {report.get('ok')}")
