"""The pack's messages on their node in a REAL ComfyUI frontend: still there after the job ends, shown whole, and
replaced by "No warnings in this run." when the next run of the node is clean.

    python tests/nodes/real_frontend_messages.py --comfyui /path/to/ComfyUI [--python its/python]
        [--front-end-root DIR/static] [--screenshots DIR] [--json report.json]

Starts ComfyUI (--cpu) as real_frontend.py does, with a tiny random Base model under the name the "Voice clone"
workflow asks for, opens that workflow in headless Chromium and runs it twice through the frontend
(app.queuePrompt): first with the text to speak the same as the voice's transcript (the pack warns on Generate),
then with another text. Then it runs "Character lines" and stops it through the API (POST /interrupt, what Cancel
sends) once Render Lines has written a line. After each job ends (and a moment for the frontend's own end-of-job
clean-up), it reads the text of every node's message widget, whether it is on screen, and whether it shows every
line; and the browser console's errors. Needs playwright in the Python that runs this script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_frontend import ROOT, open_page, save_png, start_server, wait_idle  # noqa: E402

TRANSCRIPT = "A short sentence that the reference clip says."
MESSAGES_JS = """() => window.app.graph.nodes.flatMap(n => (n.widgets || []).filter(w => w.name === 'morph_messages')
  .map(w => { const e = w.element, r = e.getBoundingClientRect();
              return {node: n.id, type: n.type, text: e.textContent, on_screen: r.width > 0 && r.height > 0,
                      whole: e.scrollHeight <= e.clientHeight + 1}; }))"""
SET_JS = """([node, name, value]) => { const n = window.app.graph.getNodeById(node);
  const w = n.widgets.find(w => w.name === name); w.value = value; w.callback?.(value); }"""


def run(page, port: int, text: str) -> list[dict]:
    page.evaluate(SET_JS, [4, "text", text])
    page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
    wait_idle(port)
    time.sleep(3.0)  # the frontend's end-of-job clean-up (1.58 clears progress text then)
    return page.evaluate(MESSAGES_JS)


def stop_render_lines(page, port: int, output: Path) -> dict:
    """Character lines, interrupted once Render Lines (node 8) has written a line: its message and the line files."""
    wf = json.loads((ROOT / "workflows" / "Character lines.json").read_text())
    page.evaluate("async (wf) => { await window.app.loadGraphData(wf, true, true, 'Character lines'); }", wf)
    time.sleep(2.0)
    page.evaluate(SET_JS, [8, "batch_size", 2])  # lines end a few at a time, so the stop falls between them
    page.evaluate(SET_JS, [8, "max_new_tokens", 200])
    page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
    end = time.time() + 180
    while not list(output.glob("qwen3-tts/character_lines_*.wav")) and time.time() < end:
        time.sleep(0.05)
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/interrupt", data=b"", method="POST"))
    wait_idle(port)
    time.sleep(3.0)
    return {"messages": page.evaluate(MESSAGES_JS),
            "files": sorted(p.name for p in output.glob("qwen3-tts/character_lines_*.wav"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH"))
    ap.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON", sys.executable))
    ap.add_argument("--port", type=int, default=8198)
    ap.add_argument("--front-end-root", default=os.environ.get("COMFYUI_FRONT_END_ROOT"))
    ap.add_argument("--screenshots")
    ap.add_argument("--json")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    from bench.random_model import build_random_model

    work = Path(tempfile.mkdtemp(prefix="real-frontend-messages-"))
    build_random_model(work / "models" / "Qwen3-TTS-12Hz-0.6B-Base", "tiny", "base", seed=0)
    server = start_server(Path(args.comfyui), args.python, args.port, work, args.front_end_root,
                          models=work / "models")
    shots = Path(args.screenshots) if args.screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                        args=["--no-sandbox"])
            page = open_page(browser, args.port)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            wf = json.loads((ROOT / "workflows" / "Voice clone.json").read_text())
            page.evaluate("async (wf) => { await window.app.loadGraphData(wf, true, true, 'Voice clone'); }", wf)
            time.sleep(2.0)
            page.evaluate(SET_JS, [3, "transcript", TRANSCRIPT])
            page.evaluate(SET_JS, [4, "max_new_tokens", 8])
            report = {"frontend_version": page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ || null")}
            report["swapped"] = run(page, args.port, TRANSCRIPT)
            if shots:
                save_png(page, shots / "1 swapped text, after the job.png")
            report["clean"] = run(page, args.port, "Another sentence to speak.")
            if shots:
                save_png(page, shots / "2 clean run, after the job.png")
            report["saved_widgets_values"] = page.evaluate(
                "() => window.app.graph.serialize().nodes.find(n => n.id === 4).widgets_values.length")
            report["stopped"] = stop_render_lines(page, args.port, work / "output")
            if shots:
                save_png(page, shots / "3 Render Lines stopped, after the job.png")
            browser.close()
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
    report["console_errors"] = errors
    report["server_log_tail"] = (work / "server.log").read_text()[-2000:]
    text = json.dumps(report, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
