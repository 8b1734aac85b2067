"""Run the pack inside a real ComfyUI, as a user's install runs it, and measure it through the HTTP API.

    COMFYUI_PATH=/path/to/ComfyUI python tools/comfy_gpu_run.py --out DIR [--cpu --size tiny]

On the GPU device machine tools/comfy_gpu_run.sh calls this with the carried checkout and wheels.
ComfyUI is started with its own defaults (its CUDA allocator choice included); --cpu exists only
to test this script on a machine without a GPU. In order, it:

1. installs the ComfyUI server's missing wheels (tools/device_wheels.txt, section server) and the
   pack as the README says: a copy in custom_nodes/, `pip install -r requirements.txt` and
   `pip install --no-deps qwen-tts==0.1.1`, offline from the wheels folder;
2. builds random-weight checkpoints (bench/random_model.py) into models/qwen3-tts under the folder
   names the workflows ask for, and puts the bundled default voice into input/ under each file
   name a workflow loads;
3. starts ComfyUI and, through POST /prompt, runs every workflow in workflows/ (converted to the
   API form with the repo's converter against the live /object_info), a Render Lines job of
   --lines lines, an /interrupt in mid-generation and a rerun, and --runs generations in a row;
4. records each node's wall time (websocket "executing" messages), the text each node shows
   (warnings, "preparing the fused decoder"), VRAM before loading, while loaded, after "Unload
   models" (/free), after one more load-generate-unload cycle and after each of the repeated runs,
   and the server log;
5. as a control, starts a fresh server and measures the same VRAM around one generation in
   speed_mode eager (no CUDA graph, no fused decoder);
6. writes report.json, server.log and server_control.log into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK_FOLDER = "comfyui-qwen3-tts-morph"  # the folder name the README's install gives the pack
# What a user's clone does not hold: build outputs, environments, the carried checkout and wheels.
NOT_COPIED = {".git", ".whl", ".comfyui", ".gl", "__pycache__", ".pytest_cache", ".hypothesis", "out", "output",
              "models", "results"}
VARIANT_OF = {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}
DEFAULT_VOICE = ROOT / "assets" / "default_voice.wav"
MIB = 2**20
BINARY_TEXT = struct.pack(">I", 3)  # ComfyUI's protocol.BinaryEventTypes.TEXT: a node's progress text
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


def load_workflow_tools():
    """The repo's UI -> API converter (tests/nodes/workflow_tools.py), loaded by path so that the
    tests package and its fixtures are not imported into this process."""
    spec = importlib.util.spec_from_file_location("workflow_tools", ROOT / "tests" / "nodes" / "workflow_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_manifest(path: Path) -> dict[str, list[str]]:
    """{section: ["name==version", ...]} from tools/device_wheels.txt ("[section]" lines start one)."""
    sections: dict[str, list[str]] = {}
    current = "default"
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        sections.setdefault(current, []).append(line)
    return sections


# -- processes and HTTP -----------------------------------------------------------------------
def run_logged(cmd, log: list, cwd=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    t0 = time.time()
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log.append({"cmd": " ".join(map(str, cmd)), "rc": result.returncode, "s": round(time.time() - t0, 2),
                "tail": (result.stdout + result.stderr)[-1500:]})
    if result.returncode:
        raise RuntimeError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def progress_text(data: bytes) -> dict:
    """A binary TEXT message (send_progress_text: event type, node id length, node id, text) as a message dict."""
    size = struct.unpack(">I", data[4:8])[0]
    return {"type": "progress_text", "data": {"node": data[8:8 + size].decode(),
                                              "text": data[8 + size:].decode(errors="replace")}}


class Server:
    """A ComfyUI server process, its HTTP API and its websocket messages (timestamped)."""

    def __init__(self, base: str):
        self.base = base
        self.client_id = uuid.uuid4().hex
        self.messages: list[tuple[float, dict]] = []
        self.cond = threading.Condition()
        self.proc: subprocess.Popen | None = None
        self.log = None

    def start(self, cmd: list[str], cwd: Path, log_path: Path) -> dict:
        """Start ComfyUI (`cmd` without its port), wait until it answers, listen; its /system_stats."""
        self.log = open(log_path, "w")
        port = self.base.rsplit(":", 1)[1]
        self.proc = subprocess.Popen(cmd + ["--port", port], cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        t0 = time.time()
        while True:
            try:
                stats = self.get("/system_stats", timeout=5)
                break
            except Exception:
                if self.proc.poll() is not None or time.time() - t0 > 240:
                    raise RuntimeError(f"ComfyUI did not start: see {log_path.name}")
                time.sleep(0.5)
        self.listen()
        return stats

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.log is not None:
            self.log.close()
            self.log = None

    def get(self, path: str, timeout: float = 30):
        with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def post(self, path: str, body: dict, timeout: float = 30):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:  # /prompt answers 400 with the validation errors
            return {"http_error": e.code, "body": json.loads(e.read() or b"null")}
        try:
            return json.loads(data) if data else None
        except json.JSONDecodeError:
            return data.decode(errors="replace")

    def listen(self):
        """Collect every websocket message in a background thread (aiohttp ships with ComfyUI)."""
        import aiohttp

        async def loop():
            url = self.base.replace("http", "ws", 1) + f"/ws?clientId={self.client_id}"
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(url, max_msg_size=0, heartbeat=30) as ws:
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.TEXT:
                            message = json.loads(msg.data)
                        elif msg.type == aiohttp.WSMsgType.BINARY and msg.data[:4] == BINARY_TEXT:
                            message = progress_text(msg.data)
                        else:
                            continue
                        with self.cond:
                            self.messages.append((time.time(), message))
                            self.cond.notify_all()

        threading.Thread(target=lambda: asyncio.run(loop()), daemon=True).start()

    def wait_for(self, pred, timeout: float, start: int = 0):
        """The first message from index `start` on that satisfies pred, as (index, time, message), or None."""
        deadline = time.time() + timeout
        with self.cond:
            i = start
            while True:
                while i < len(self.messages):
                    t, m = self.messages[i]
                    if pred(m):
                        return i, t, m
                    i += 1
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def queue(self, prompt: dict, timeout: float) -> dict:
        """POST a prompt and wait for its end; per-node wall times from the "executing" messages."""
        mark = len(self.messages)
        t0 = time.time()
        answer = self.post("/prompt", {"prompt": prompt, "client_id": self.client_id})
        if not isinstance(answer, dict) or "prompt_id" not in answer:
            return {"status": "rejected", "answer": answer}
        pid = answer["prompt_id"]
        ends = ("execution_error", "execution_interrupted")

        def done(m):
            d = m.get("data", {})
            return d.get("prompt_id") == pid and (m["type"] in ends or (m["type"] == "executing" and d.get("node") is None))

        found = self.wait_for(done, timeout, mark)
        result = {"prompt_id": pid, "wall_s": round(time.time() - t0, 3)}
        if found is None:
            result["status"] = "timeout"
            return result
        _, t_end, end = found
        result["status"] = {"execution_error": "error", "execution_interrupted": "interrupted"}.get(end["type"], "success")
        if end["type"] == "execution_error":
            d = end["data"]
            result["error"] = {k: d.get(k) for k in ("node_id", "node_type", "exception_type", "exception_message")}
        result.update(self.node_times(pid, prompt, mark, t_end))
        result["node_texts"] = self.node_texts(mark)
        return result

    def node_texts(self, mark: int) -> dict:
        """The last text each node showed (send_progress_text) since message `mark`: warnings, status lines."""
        with self.cond:
            return {m["data"]["node"]: m["data"]["text"] for _, m in self.messages[mark:] if m["type"] == "progress_text"}

    def node_times(self, pid: str, prompt: dict, mark: int, t_end: float) -> dict:
        with self.cond:
            msgs = [(t, m) for t, m in self.messages[mark:] if m.get("data", {}).get("prompt_id") == pid]
        times, cached, current = [], [], None
        for t, m in msgs:
            if m["type"] == "execution_cached":
                cached += m["data"].get("nodes", [])
            if m["type"] in ("executing", "execution_error", "execution_interrupted", "execution_success"):
                if current is not None:
                    node, t0 = current
                    times.append({"node": node, "class_type": prompt.get(node, {}).get("class_type"),
                                  "s": round(t - t0, 3)})
                    current = None
                if m["type"] == "executing" and m["data"].get("node") is not None:
                    current = (m["data"]["node"], t)
        return {"node_times": times, "cached": cached}


def vram(server: Server, pid: int | None, cpu: bool) -> dict:
    """The server process's GPU memory (nvidia-smi) and ComfyUI's own view of it (/system_stats)."""
    out = {}
    try:
        dev = server.get("/system_stats")["devices"][0]
        reserved, free = dev.get("torch_vram_total", 0), dev.get("torch_vram_free", 0)
        # torch_vram_free is reserved minus active: what remains is memory torch has handed out
        out.update(torch_reserved_mib=round(reserved / MIB, 1), torch_active_mib=round((reserved - free) / MIB, 1),
                   device_free_mib=round(dev.get("vram_free", 0) / MIB, 1))
    except Exception as e:  # the measurement must not stop the run
        out["system_stats_error"] = repr(e)
    if cpu:
        return out
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout
        rows = [line.split(",") for line in apps.strip().splitlines() if line.strip()]
        mine = [int(r[1]) for r in rows if pid is not None and int(r[0]) == pid]
        # In a container nvidia-smi may list host PIDs; the server is then the only process on the GPU.
        out["process_mib"] = mine[0] if mine else (sum(int(r[1]) for r in rows) if rows else None)
        out["process_match"] = "pid" if mine else "all compute processes"
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout.split()
        out["gpu_used_mib"] = int(used[0]) if used else None
    except Exception as e:
        out["nvidia_smi_error"] = repr(e)
    return out


def settle_vram(server: Server, pid, cpu: bool, seconds: float = 30.0, grace: float = 3.0) -> dict:
    """The reading once "Unload models" has taken effect. ComfyUI's prompt worker unloads asynchronously
    (it moves the weights to the CPU, collects garbage and empties the cache, about a second for 2 GB) and
    says nothing when done, so wait `grace` seconds first, then until two readings 1 s apart agree."""
    time.sleep(grace)
    last = vram(server, pid, cpu)
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(1.0)
        now = vram(server, pid, cpu)
        if now.get("process_mib") == last.get("process_mib") and now.get("torch_reserved_mib") == last.get("torch_reserved_mib"):
            return now
        last = now
    return last


# -- prompts ----------------------------------------------------------------------------------
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


# -- the run ----------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH"), help="ComfyUI checkout (default $COMFYUI_PATH)")
    ap.add_argument("--out", required=True, help="folder for report.json and server.log")
    ap.add_argument("--wheels", default=str(ROOT / ".whl" / "comfy"), help="folder of wheels pip installs from, offline")
    ap.add_argument("--manifest", default=str(ROOT / "tools" / "device_wheels.txt"))
    ap.add_argument("--commit", default=os.environ.get("PROJECT_COMMIT"), help="project commit (default $PROJECT_COMMIT, else git)")
    ap.add_argument("--cpu", action="store_true", help="only for testing this script without a GPU: ComfyUI --cpu")
    ap.add_argument("--size", default="0.6b", help="random checkpoint dims for 0.6B names (tiny to test on CPU)")
    ap.add_argument("--size-1.7b", dest="size_17", default=None,
                    help="dims for 1.7B names (default: 1.7b, or --size when it is tiny)")
    ap.add_argument("--lines", type=int, default=32, help="lines of the Render Lines job")
    ap.add_argument("--batch-size", type=int, default=32, help="Render Lines batch_size for that job")
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
    if not commit:
        commit, source = git_head(), "git rev-parse HEAD"
    report: dict = {"commit": commit or "unknown", "commit_source": source, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "cpu_test_mode": args.cpu, "argv": sys.argv[1:], "steps": {}}
    pip_log: list = []
    report["install"] = pip_log

    def save():
        report["total_s"] = round(time.time() - t_start, 1)
        (out / "report.json").write_text(json.dumps(report, indent=2))

    server = Server(f"http://127.0.0.1:{args.port}")
    try:
        # 1. ComfyUI's missing packages, then the pack as the README installs it, offline.
        wheels = Path(args.wheels).resolve()
        find_links = ["--no-index"] + (["--find-links", str(wheels)] if wheels.is_dir() else [])
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir"] + find_links
        manifest = read_manifest(Path(args.manifest))
        t0 = time.time()
        if manifest.get("server"):
            run_logged(pip + ["--no-deps"] + manifest["server"], pip_log)
        pack = comfy / "custom_nodes" / PACK_FOLDER
        if pack.exists():
            shutil.rmtree(pack)
        # The checkout may sit inside the repository (the device copy carries it as .comfyui): never copy it into itself.
        shutil.copytree(ROOT, pack, ignore=lambda d, names: [n for n in names if n in NOT_COPIED or n.startswith(".venv")
                                                             or (Path(d) / n).resolve() == comfy])
        run_logged(pip + ["-r", "requirements.txt"], pip_log, cwd=pack)
        run_logged(pip + ["--no-deps", "qwen-tts==0.1.1"], pip_log, cwd=pack)
        # Builds the random checkpoints (not part of the pack's install).
        if manifest.get("tools"):
            run_logged(pip + ["--no-deps"] + manifest["tools"], pip_log)
        versions = run_logged([python, "-c", "import sys, torch, transformers; print(sys.version.split()[0], "
                               "torch.__version__, transformers.__version__)"], pip_log).stdout.split()
        report["python"], report["torch"], report["transformers"] = versions[:3]
        report["steps"]["install_s"] = round(time.time() - t0, 1)

        # 2. Random checkpoints under the names the workflows load, and their input clips.
        wt = load_workflow_tools()
        workflows = sorted((ROOT / "workflows").glob("*.json"))
        ui = {p.stem: json.loads(p.read_text()) for p in workflows}
        model_names, audio_names = set(), set()
        for wf in ui.values():
            for node in wf["nodes"]:
                if node["type"] == "Qwen3TTSMorphLoadModel":
                    model_names.add(node["widgets_values"][0])
                if node["type"] == "LoadAudio":
                    audio_names.add(node["widgets_values"][0])
        models_dir = comfy / "models" / "qwen3-tts"
        models_dir.mkdir(parents=True, exist_ok=True)
        builds = {}
        t_build = time.time()
        threads = str(max(1, (os.cpu_count() or 2) // max(1, len(model_names))))
        for name in sorted(model_names):
            folder = name.split("/")[-1]
            variant = next((v for k, v in VARIANT_OF.items() if k in folder), "base")
            size = args.size if "1.7B" not in folder or args.size.startswith("tiny") else (args.size_17 or "1.7b")
            if args.size_17 and "1.7B" in folder:
                size = args.size_17
            target = models_dir / folder
            if target.exists():
                shutil.rmtree(target)
            cmd = [python, "-m", "bench.random_model", "--size", size, "--variant", variant, "--out", str(target),
                   "--dtype", "float32" if args.cpu else "bfloat16"]
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads}
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            waiter = threading.Thread(target=lambda p=proc: setattr(p, "log_tail", p.communicate()[0][-2000:]))
            waiter.start()
            builds[folder] = (proc, waiter, size, variant)
        input_dir = comfy / "input"
        input_dir.mkdir(exist_ok=True)
        for name in audio_names:
            shutil.copy(DEFAULT_VOICE, input_dir / name)
        report["inputs"] = {n: "assets/default_voice.wav" for n in sorted(audio_names)}

        # 3. ComfyUI, started while the checkpoints build: the checkpoints are read only at the first run.
        cmd = [python, "main.py", "--listen", "127.0.0.1",
               # its nodes call paid online services, and this machine has no network
               "--disable-api-nodes"]
        if args.cpu:
            cmd.append("--cpu")
        if importlib.util.find_spec("comfyui_frontend_package") is None:
            # API runs need no frontend; without its package ComfyUI exits, so serve an empty folder.
            stub = Path(tempfile.mkdtemp(prefix="frontend-stub-"))
            (stub / "index.html").write_text("<html>API only</html>")
            cmd += ["--front-end-root", str(stub)]
        report["server_cmd"] = " ".join(cmd)
        t0 = time.time()
        stats = server.start(cmd, comfy, out / "server.log")
        report["steps"]["server_start_s"] = round(time.time() - t0, 1)
        report["system"] = stats.get("system", {})
        report["comfy_devices"] = [{k: d.get(k) for k in ("name", "type", "vram_total")} for d in stats.get("devices", [])]
        info = server.get("/object_info", timeout=120)
        if "Qwen3TTSMorphGenerate" not in info:
            raise RuntimeError("the pack's nodes are not in /object_info: its import failed (see server.log)")

        for folder, (proc, waiter, size, variant) in builds.items():
            waiter.join(900)
            if proc.returncode != 0:
                raise RuntimeError(f"building {folder} failed:\n{getattr(proc, 'log_tail', '')}")
            built = max(f.stat().st_mtime for f in (models_dir / folder).rglob("*") if f.is_file())
            builds[folder] = {"size": size, "variant": variant, "s": round(built - t_build, 1)}
        report["models"] = builds
        report["steps"]["models_ready_s"] = round(time.time() - t_build, 1)
        save()

        spid = server.proc.pid
        report["vram"] = {"baseline": settle_vram(server, spid, args.cpu, 5)}

        # 4. Every workflow, as the frontend would queue it.
        results = {}
        for name, wf in ui.items():
            if budget(args) < 10:
                report.setdefault("workflows", {})[name] = {"status": "skipped", "reason": "deadline", "wall_s": 0}
                continue
            prompt = capped(with_defaults(wt.ui_to_api(wf, info), info), args.max_new_tokens)
            results[name] = server.queue(prompt, budget(args))
            results[name]["outputs"] = outputs_of(server, results[name].get("prompt_id"))
            print(f"workflow {name}: {results[name]['status']} in {results[name]['wall_s']} s", flush=True)
            report.setdefault("workflows", {})[name] = results[name]
            report["steps"].setdefault("workflows_s", 0)
            report["steps"]["workflows_s"] += results[name]["wall_s"]
            save()

        # 5. A Render Lines job of --lines lines, from the dialogue workflow's graph.
        base = next((wt.ui_to_api(wf, info) for wf in ui.values()
                     if any(n["type"] == "Qwen3TTSMorphRenderLines" for n in wf["nodes"])), None)
        if base is None or budget(args) < 30:
            report["render_lines"] = {"status": "skipped", "reason": "deadline" if base else "no Render Lines workflow"}
        else:
            prompt = with_defaults(base, info)
            names = [n["inputs"]["name"] for _, n in find(prompt, "Qwen3TTSMorphVoiceBank")]
            for _, node in find(prompt, "Qwen3TTSMorphRenderLines"):
                node["inputs"].update(script=script_of(names, args.lines), batch_size=args.batch_size,
                                      filename_prefix="comfy_gpu_run/lines", seed=7, resume=False)
            result = server.queue(capped(prompt, args.max_new_tokens), budget(args))
            result.update(lines=args.lines, batch_size=args.batch_size, outputs=outputs_of(server, result.get("prompt_id")))
            report["render_lines"] = result
            print(f"render lines x{args.lines}: {result['status']} in {result['wall_s']} s", flush=True)
        save()

        # 6. /interrupt in mid-generation, then the same graph again.
        # The plainest cloning graph: the fewest nodes with Load Audio -> Voice Prompt -> Generate.
        cloning = [wf for wf in ui.values() if {"LoadAudio", "Qwen3TTSMorphVoicePrompt", "Qwen3TTSMorphGenerate"}
                   <= {x["type"] for x in wf["nodes"]}]
        clone = wt.ui_to_api(min(cloning, key=lambda wf: len(wf["nodes"])), info) if cloning else None
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
        report["ok"] = (all(r.get("status") == "success" for r in report.get("workflows", {}).values())
                        and report["render_lines"].get("status") in ("success", "skipped")
                        and report["interrupt"].get("status") in ("execution_interrupted", "skipped")
                        and report["interrupt"].get("rerun", {}).get("status", "success") == "success"
                        and report["repeated"]["all_success"])
    except Exception as e:
        import traceback

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


def git_head() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


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
    pid = answer.get("prompt_id") if isinstance(answer, dict) else None
    if not pid:
        return {"status": "rejected", "answer": answer}

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
        print(f"{name:24} {r['status']:11} {r['wall_s']:7.2f} s  {times}  {r.get('error', '')}")
    for key in ("render_lines", "interrupt"):
        if key in report:
            r = report[key]
            print(f"{key:24} {r.get('status')}  wall {r.get('wall_s')}  latency {r.get('latency_s')}")
    if "repeated" in report:
        rep = report["repeated"]
        print(f"repeated x{len(rep['runs'])}: all success {rep['all_success']}, median generate "
              f"{rep['generate_s_median']} s, growth {json.dumps(rep['growth'])}")
    print("vram", json.dumps(report.get("vram", {}).get("check")))
    print("vram, eager control", json.dumps(report.get("vram_control_eager", {}).get("check")))
    if report.get("fatal"):
        print("FATAL", report["fatal"][-800:])
    print(f"total {report.get('total_s')} s, ok {report.get('ok')}")


if __name__ == "__main__":
    sys.exit(main())
