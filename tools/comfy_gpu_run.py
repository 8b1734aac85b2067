"""Run the pack inside a real ComfyUI, as a user's install runs it, and measure it through the HTTP API.

    COMFYUI_PATH=/path/to/ComfyUI python tools/comfy_gpu_run.py --out DIR [--cpu --size tiny]

On the GPU device machine tools/comfy_gpu_run.sh calls this with the carried checkout and wheels.
ComfyUI is started with its own defaults (its CUDA allocator choice included); --cpu exists only
to test this script on a machine without a GPU. In order, it:

1. installs the ComfyUI server's missing wheels (tools/device_wheels/comfyui-VERSION.txt, the checkout's
   version unless --comfyui-version names another) and the pack as the README says: a copy in
   custom_nodes/, `pip install -r requirements.txt` and `pip install --no-deps qwen-tts==0.1.1`,
   offline from the wheels folder (or from all its parts, carried over several calls: wheels.py);
2. builds random-weight checkpoints (bench/random_model.py) into models/qwen3-tts under the folder
   names the workflows ask for, and puts the bundled default voice into input/ under each file
   name a workflow loads;
3. starts ComfyUI and, through POST /prompt, runs every workflow in workflows/ (converted to the
   API form with the repo's converter against the live /object_info), a Render Lines job of
   --lines lines at each of --batch-sizes, one at a batch_size over the node's max (ComfyUI must refuse
   it), an /interrupt in mid-generation and a rerun, and --runs generations in a row;
4. records each node's wall time (websocket "executing" messages), the text each node shows
   (warnings, "preparing the fused decoder"), VRAM before loading, while loaded, after "Unload
   models" (/free), after one more load-generate-unload cycle and after each of the repeated runs,
   and the server log;
5. as a control, starts a fresh server and measures the same VRAM around one generation in
   speed_mode eager (no CUDA graph, no fused decoder);
6. under memory pressure, in a fresh server whose --reserve-vram leaves room for one model, not two: our clone,
   then a VoiceDesign model beside it that ComfyUI must evict ours to load, then ours loaded back, whose take
   must equal the first; with ComfyUI's defaults and with --disable-dynamic-vram where it has that flag;
7. writes report.json, server.log, server_control.log and server_eviction_*.log into --out.

A prompt ComfyUI refuses (a value over a node's max, say) is recorded as status "rejected" with ComfyUI's
reasons, and the run goes on. This file keeps the order of the steps; tools/comfy_gpu/ holds them:
install.py (1 and 2), wheels.py (the manifests and parts), server.py (the server, its messages, its VRAM),
runs.py (3 to 5), eviction.py (6), report.py (7).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path

# Run as a script, Python puts tools/ first on sys.path: the parts are the comfy_gpu package beside this file.
from comfy_gpu.eviction import eviction_test
from comfy_gpu.install import (ROOT, changed_since_staging, finish_checkpoints, git_head, install,
                               load_workflow_tools, loaded_names, stage_voices, start_checkpoints)
from comfy_gpu.report import log_findings, passed, print_summary, vram_check
from comfy_gpu.runs import (budget, cloning_prompt, eager_control, generate_and_unload, interrupt_test, over_max,
                            render_lines, repeated_runs, run_workflows, with_defaults, workflow_with)
from comfy_gpu.server import Server, server_command, settle_vram, vram


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH"), help="ComfyUI checkout (default $COMFYUI_PATH)")
    ap.add_argument("--out", required=True, help="folder for report.json and server.log")
    ap.add_argument("--wheels", default=str(ROOT / ".whl" / "comfy"), help="folder of wheels pip installs from, offline")
    ap.add_argument("--comfyui-version", default=None,
                    help="whose wheel manifest to install (tools/device_wheels/; default: the checkout's version)")
    ap.add_argument("--commit", default=os.environ.get("PROJECT_COMMIT"), help="project commit (default $PROJECT_COMMIT, else git)")
    ap.add_argument("--cpu", action="store_true", help="only for testing this script without a GPU: ComfyUI --cpu")
    ap.add_argument("--size", default="0.6b", help="random checkpoint dims for 0.6B names (tiny to test on CPU)")
    ap.add_argument("--size-1.7b", dest="size_17", default=None,
                    help="dims for 1.7B names (default: 1.7b, or --size when it is tiny)")
    ap.add_argument("--lines", type=int, default=256, help="lines of each Render Lines job")
    ap.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64],
                    help="a Render Lines job at each of these batch_size values (default 16,64: the node's default and max)")
    ap.add_argument("--runs", type=int, default=20, help="generations in a row")
    ap.add_argument("--run-frames", type=int, default=200, help="max_new_tokens of each of those generations")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="cap every generation node's max_new_tokens (to test on CPU; default: as the workflows say)")
    ap.add_argument("--port", type=int, default=8188)
    ap.add_argument("--prompt-timeout", type=float, default=240)
    ap.add_argument("--deadline", type=float, default=520,
                    help="seconds from the start after which no more prompts are queued (a device call ends at 600)")
    args = ap.parse_args()
    if not args.comfyui:
        ap.error("give --comfyui or set COMFYUI_PATH to a ComfyUI checkout")
    comfy = Path(args.comfyui).resolve()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    t_start = time.time()
    args.deadline_at = t_start + args.deadline
    commit, source = args.commit, "--commit / $PROJECT_COMMIT"
    # written by tools/comfy_gpu_run_stage.sh from this tree; a device copy's .git, if any, can be stale
    staged = comfy / "project_commit.txt"
    if not commit and staged.is_file():
        commit, source = staged.read_text().strip(), str(staged)
        # commits made after staging are in the copy this call carried, not in the staged record: said, not hidden
        listing = comfy / "project_files.txt"
        changed = changed_since_staging(listing) if listing.is_file() else []
        if changed:
            commit, source = f"{commit} with {len(changed)} files changed since", f"{staged}: {', '.join(changed)}"
    if not commit:
        commit, source = git_head(), "git rev-parse HEAD"
    report: dict = {"commit": commit or "unknown", "commit_source": source,
                    "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "cpu_test_mode": args.cpu, "argv": sys.argv[1:], "steps": {}}
    pip_log: list = []
    report["install"] = pip_log

    def save():
        report["total_s"] = round(time.time() - t_start, 1)
        (out / "report.json").write_text(json.dumps(report, indent=2))

    server = Server(f"http://127.0.0.1:{args.port}")
    try:
        # 1. ComfyUI's missing packages, then the pack as the README installs it, offline.
        t0 = time.time()
        report.update(install(python, comfy, args, pip_log))
        report["steps"]["install_s"] = round(time.time() - t0, 1)

        # 2. Random checkpoints under the names the workflows load, and their input clips.
        wt = load_workflow_tools()
        ui = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "workflows").glob("*.json"))}
        model_names, audio_names = loaded_names(ui)
        models_dir = comfy / "models" / "qwen3-tts"
        t_build = time.time()
        builds = start_checkpoints(python, models_dir, model_names, args)
        report["inputs"] = stage_voices(comfy, audio_names)

        # 3. ComfyUI, started while the checkpoints build: the checkpoints are read only at the first run.
        cmd = server_command(python, args.cpu)
        report["server_cmd"] = " ".join(cmd)
        t0 = time.time()
        stats = server.start(cmd, comfy, out / "server.log")
        report["steps"]["server_start_s"] = round(time.time() - t0, 1)
        report["system"] = stats.get("system", {})
        report["comfy_devices"] = [{k: d.get(k) for k in ("name", "type", "vram_total")} for d in stats.get("devices", [])]
        info = server.get("/object_info", timeout=120)
        if "Qwen3TTSMorphGenerate" not in info:
            raise RuntimeError("the pack's nodes are not in /object_info: its import failed (see server.log)")
        report["models"] = finish_checkpoints(builds, models_dir, t_build)
        report["steps"]["models_ready_s"] = round(time.time() - t_build, 1)
        save()

        spid = server.proc.pid
        report["vram"] = {"baseline": settle_vram(server, spid, args.cpu, 5)}

        # 4. Every workflow, as the frontend would queue it.
        run_workflows(server, ui, info, wt, args, report, save)

        # 5. A Render Lines job of --lines lines at each batch size, from the dialogue workflow's graph; then
        # one over the node's max, which ComfyUI must refuse without stopping this run.
        report["render_lines"] = render_lines(server, ui, info, wt, args)
        report["over_max"] = over_max(server, ui, info, wt, args)
        save()

        # 6. /interrupt in mid-generation, then the same graph again.
        clone = cloning_prompt(ui, info, wt)
        report["interrupt"] = (interrupt_test(server, with_defaults(clone, info), args) if clone and budget(args) >= 30
                               else {"status": "skipped"})
        print(f"interrupt: {json.dumps(report['interrupt'].get('latency_s'))} s", flush=True)
        save()

        # 7. --runs generations in a row (a new seed each, so ComfyUI's cache does not skip them).
        report["repeated"] = repeated_runs(server, with_defaults(clone, info), args, spid)
        report["vram"]["loaded"] = vram(server, spid, args.cpu)
        save()

        # 8. "Unload models", then "Free model and node cache" (the two buttons).
        server.post("/free", {"unload_models": True})
        report["vram"]["after_unload_models"] = settle_vram(server, spid, args.cpu)
        server.post("/free", {"unload_models": True, "free_memory": True})
        report["vram"]["after_free_memory"] = settle_vram(server, spid, args.cpu)
        # 8b. Load, generate and unload once more: what one more cycle leaves, once CUDA has loaded the
        # kernels a generation uses (the first cycle's growth includes them, and no API unloads them).
        if clone and budget(args) >= 30:
            report["vram"]["second_cycle"] = generate_and_unload(server, spid, clone, 2000, args)
        report["vram"]["check"] = vram_check(report["vram"])
        save()

        # 9. The same measurement in a fresh server with speed_mode eager (no CUDA graph, no fused decoder).
        server.stop()
        report["vram_control_eager"] = (eager_control(cmd, comfy, out, args, copy.deepcopy(clone))
                                        if clone and budget(args) >= 60 else {"status": "skipped"})

        # 10. Memory pressure: a fresh server with room for one model, not two; a VoiceDesign model beside our clone
        # makes ComfyUI evict ours, then ours is loaded back and must give the same take (comfy_gpu/eviction.py).
        design = workflow_with(ui, info, wt, "Qwen3TTSMorphVoiceDesign")
        total = (report.get("comfy_devices") or [{}])[0].get("vram_total")
        report["eviction"] = (eviction_test(cmd, comfy, out, args, clone, design, info, total)
                              if clone and design and budget(args) >= 90 else {"status": "skipped"})
        save()
        report["ok"] = passed(report)
    except Exception:
        report["fatal"] = traceback.format_exc()[-4000:]
        print(report["fatal"], file=sys.stderr)
        report["ok"] = False
    finally:
        server.stop()
        if (out / "server.log").exists():
            report["server_log_findings"] = log_findings(out / "server.log")
        save()
    print_summary(report)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
