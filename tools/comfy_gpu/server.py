"""A ComfyUI server for the run: its command line, the process, its HTTP API, its websocket messages
(timestamped, for per-node wall times and the text nodes show), and the GPU memory it holds."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

MIB = 2**20


def server_command(python: str, cpu: bool) -> list[str]:
    """ComfyUI's command line, without its port: its own defaults, offline."""
    cmd = [python, "main.py", "--listen", "127.0.0.1",
           # its nodes call paid online services, and this machine has no network
           "--disable-api-nodes"]
    if cpu:
        cmd.append("--cpu")
    if importlib.util.find_spec("comfyui_frontend_package") is None:
        # API runs need no frontend; without its package ComfyUI exits, so serve an empty folder.
        stub = Path(tempfile.mkdtemp(prefix="frontend-stub-"))
        (stub / "index.html").write_text("<html>API only</html>")
        cmd += ["--front-end-root", str(stub)]
    return cmd


def rejected(answer) -> dict | None:
    """None when /prompt queued the prompt; else the rejection, with ComfyUI's reasons as text (a value
    over a node's max, a missing input: ComfyUI answers 400 with an error and the errors of each node)."""
    if isinstance(answer, dict) and "prompt_id" in answer:
        return None
    body = answer.get("body") if isinstance(answer, dict) else None
    if not isinstance(body, dict):
        return {"status": "rejected", "error": str(answer)[:2000], "answer": answer}
    error, node_errors = body.get("error"), body.get("node_errors")
    lines = [reason(error) if isinstance(error, dict) else str(error)]
    for node, found in (node_errors.items() if isinstance(node_errors, dict) else ()):
        lines += [f"node {node} ({found.get('class_type')}): {reason(e)}" for e in found.get("errors", [])]
    return {"status": "rejected", "error": "\n".join(lines), "answer": answer}


def reason(error: dict) -> str:
    """One of ComfyUI's validation errors as a line: its message and details."""
    return ": ".join(str(error[k]) for k in ("message", "details") if error.get(k))


MESSAGES_EVENT = "qwen3tts-morph.messages"  # nodes/services.py's


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
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue  # previews and progress text, in ComfyUI's binary frames
                        message = json.loads(msg.data)
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
        refused = rejected(answer)
        if refused is not None:
            return {**refused, "wall_s": round(time.time() - t0, 3)}
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
        """The last text the pack showed on each node since message `mark` (its messages event, which
        nodes/web/messages.js draws): warnings, status lines."""
        with self.cond:
            return {m["data"]["node"]: m["data"]["text"] for _, m in self.messages[mark:] if m["type"] == MESSAGES_EVENT}

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
    says nothing when done, so wait `grace` seconds first, then until two readings 1 s apart agree, torch's
    active bytes included: under cudaMallocAsync the reserve stays put while models are still being moved."""
    time.sleep(grace)
    last = vram(server, pid, cpu)
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(1.0)
        now = vram(server, pid, cpu)
        if all(now.get(k) == last.get(k) for k in ("process_mib", "torch_reserved_mib", "torch_active_mib")):
            return now
        last = now
    return last
