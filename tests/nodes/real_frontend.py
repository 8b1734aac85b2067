"""The example workflows in a REAL ComfyUI frontend: node boxes after load, screenshots, thumbnails, and
the frontend's recorded node sizes (tests/fixtures/frontend_node_sizes.json) for the CPU layout check.

    python tests/nodes/real_frontend.py --comfyui /path/to/ComfyUI [--python /path/to/its/python]
        [--json boxes.json] [--screenshots DIR] [--fitted] [--thumbnails] [--record-fixture]
        [--front-end-root DIR/static]

Starts ComfyUI (--cpu) with this repository as a custom node, opens its frontend in headless Chromium
(playwright's Python client, Debian's chromium: $CHROMIUM, default /usr/bin/chromium) and loads each
workflow in workflows/ with app.loadGraphData, as Browse Templates does. Needs playwright in the Python
that runs this script; ComfyUI runs in --python (default: this one). test_real_comfy.py runs it when
COMFYUI_PATH is set.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "frontend_node_sizes.json"
PACK_FOLDER = "comfyui-qwen3-tts-morph"
VIEWPORT = {"width": 1600, "height": 900}

# Overlays that float over the canvas, from the page (ComfyUI frontend 1.35): the left sidebar, the
# workflow tabs, and the row below them (workflow name on the left, the Run bar on the right).
OVERLAYS_JS = """() => {
  const rect = (sel) => { const e = document.querySelector(sel); if (!e) return null;
                          const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {sidebar: rect('.side-tool-bar-container'), tabs: rect('.workflow-tabs-container'),
          breadcrumb: rect('.subgraph-breadcrumb'), actionbar: rect('.actionbar-container'),
          minimap: rect('.litegraph-minimap')};
}"""
# What a person sees as wrong right after opening: toasts (e.g. "... is missing") and nodes drawn with an error.
PROBLEMS_JS = """() => ({toasts: [...new Set([...document.querySelectorAll('.p-toast-message, [role=alert], [role=status]')]
                                  .map(e => e.innerText.trim()).filter(t => t))],
  error_nodes: window.app.graph.nodes.filter(n => n.has_errors).map(n => n.id)})"""
NODES_JS = """() => window.app.graph.nodes.map(n => ({id: n.id, type: n.type, title: n.title,
  pos: [n.pos[0], n.pos[1]], size: [n.size[0], n.size[1]]}))"""
# The frontend's own "fit view" (useLitegraphService().fitView: the nodes' bounds, ds.fitToBounds at its
# default zoom of 0.75), as when a template opens without a usable saved view.
FIT_VIEW_JS = """() => {
  const b = [Infinity, Infinity, -Infinity, -Infinity];
  for (const n of window.app.graph.nodes) { const r = n.boundingRect;
    b[0] = Math.min(b[0], r[0]); b[1] = Math.min(b[1], r[1]); b[2] = Math.max(b[2], r[0] + r[2]); b[3] = Math.max(b[3], r[1] + r[3]); }
  window.app.canvas.ds.fitToBounds([b[0] - 10, b[1] - 10, b[2] - b[0] + 20, b[3] - b[1] + 20]);
  window.app.canvas.setDirty(true, true);
  return window.app.canvas.ds.scale;
}"""
DS_JS = "() => ({offset: [window.app.canvas.ds.offset[0], window.app.canvas.ds.offset[1]], scale: window.app.canvas.ds.scale})"
# Scale and pan so that every node and group fits the canvas with a margin.
FIT_JS = """() => {
  const c = window.app.canvas, b = [Infinity, Infinity, -Infinity, -Infinity];
  const add = (x, y, w, h) => { b[0] = Math.min(b[0], x); b[1] = Math.min(b[1], y);
                                b[2] = Math.max(b[2], x + w); b[3] = Math.max(b[3], y + h); };
  for (const n of window.app.graph.nodes) add(n.pos[0], n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT, n.size[0], n.size[1] + LiteGraph.NODE_TITLE_HEIGHT);
  for (const g of window.app.graph.groups || []) add(...g._bounding);
  const W = c.canvas.width / (window.devicePixelRatio || 1), H = c.canvas.height / (window.devicePixelRatio || 1);
  const s = Math.min(W / (b[2] - b[0]), H / (b[3] - b[1])) * 0.94;
  c.ds.scale = s;
  c.ds.offset = [(W / s - (b[2] - b[0])) / 2 - b[0], (H / s - (b[3] - b[1])) / 2 - b[1]];
  c.setDirty(true, true);
}"""
SIZES_JS = """(types) => {
  const out = {};
  for (const t of types) {
    const n = LiteGraph.createNode(t);
    if (!n) { out[t] = null; continue; }
    const title = n.title;
    n.title = '';
    const bare = n.computeSize();
    out[t] = {default_title: title, width_without_title: bare[0], height: bare[1],
              widgets: (n.widgets || []).map(w => w.name), title_font: n.titleFontStyle};
  }
  const chars = {};
  for (let c = 32; c < 127; c++) chars[String.fromCharCode(c)] = LGraphCanvas._measureText(String.fromCharCode(c), '14px Inter');
  return {types: out, char_widths: chars, title_height: LiteGraph.NODE_TITLE_HEIGHT};
}"""


def start_server(comfyui: Path, python: str, port: int, work: Path, front_end_root: str | None = None,
                 models: Path | None = None) -> subprocess.Popen:
    """ComfyUI on CPU with this repo linked in as custom_nodes/comfyui-qwen3-tts-morph (its README name), and
    `models` (if given) as one more qwen3-tts model folder."""
    nodes = work / "custom_nodes"
    nodes.mkdir(parents=True, exist_ok=True)
    (nodes / PACK_FOLDER).symlink_to(ROOT, target_is_directory=True)
    inputs = work / "input"
    inputs.mkdir(exist_ok=True)
    shutil.copy(ROOT / "assets" / "default_voice.wav", inputs / "reference.wav")
    # A returning user's settings: on a first visit the frontend opens the template browser over the canvas.
    (work / "user" / "default").mkdir(parents=True, exist_ok=True)
    (work / "user" / "default" / "comfy.settings.json").write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    (work / "extra.yaml").write_text(f"pack:\n  custom_nodes: {nodes}\n" + (f"  qwen3-tts: {models}\n" if models else ""))
    log = open(work / "server.log", "w")
    proc = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--disable-api-nodes", "--extra-model-paths-config", str(work / "extra.yaml"),
                             "--input-directory", str(inputs), "--output-directory", str(work / "output"),
                             "--user-directory", str(work / "user")]
                            + (["--front-end-root", front_end_root] if front_end_root else []),
                            cwd=comfyui, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/system_stats", timeout=5).read()
            return proc
        except Exception:
            if proc.poll() is not None or time.time() - t0 > 180:
                proc.kill()
                raise RuntimeError(f"ComfyUI did not start:\n{(work / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)


def open_page(browser, port: int):
    page = browser.new_page(viewport=VIEWPORT)
    page.goto(f"http://127.0.0.1:{port}", wait_until="networkidle", timeout=180000)
    page.wait_for_function("window.app && window.app.graph && window.LiteGraph", timeout=180000)
    close_dialogs(page)
    return page


def close_dialogs(page) -> None:
    """The template browser opens by itself on a first visit, a moment after the app is up."""
    try:
        page.wait_for_selector("[role=dialog]", timeout=15000)
    except Exception:
        return
    for _ in range(5):
        page.keyboard.press("Escape")
        time.sleep(0.5)
        if page.query_selector("[role=dialog]") is None:
            return


def load(page, wf: dict, name: str) -> dict:
    page.evaluate("() => document.querySelectorAll('.p-toast-close-button').forEach(b => b.click())")
    page.evaluate("async ([wf, name]) => { await window.app.loadGraphData(wf, true, true, name); }", [wf, name])
    time.sleep(2.5)  # let the canvas draw (widgets are laid out on the first frame) and the missing-file checks end
    return {"nodes": page.evaluate(NODES_JS), "ds": page.evaluate(DS_JS), "overlays": page.evaluate(OVERLAYS_JS),
            "problems": page.evaluate(PROBLEMS_JS)}


def save_png(page, path: Path) -> None:
    """A screenshot as a 256-colour PNG: the UI is flat colours and text, so it stays legible and small."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def thumbnail(page, wf: dict, name: str, path: Path) -> None:
    """The whole graph fitted into the canvas, overlays hidden, saved as a JPEG card image."""
    import io

    from PIL import Image

    page.evaluate("async ([wf, name]) => { await window.app.loadGraphData(wf, true, false, name); }", [wf, name])
    page.add_style_tag(content=".side-tool-bar-container, .workflow-tabs-container, .subgraph-breadcrumb, "
                               ".actionbar-container, .p-toast, .litegraph-minimap, div:has(> .litegraph-minimap) "
                               "{visibility: hidden !important}")
    page.evaluate(FIT_JS)
    time.sleep(1.0)
    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    image.thumbnail((640, 360))
    image.save(path, "JPEG", quality=82)
    page.reload(wait_until="networkidle")
    page.wait_for_function("window.app && window.app.graph", timeout=180000)
    time.sleep(1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH"))
    ap.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON", sys.executable))
    ap.add_argument("--port", type=int, default=8199)
    ap.add_argument("--front-end-root", default=os.environ.get("COMFYUI_FRONT_END_ROOT"),
                    help="serve this frontend (an unpacked comfyui-frontend-package's static/); $COMFYUI_FRONT_END_ROOT")
    ap.add_argument("--json", help="write every workflow's node boxes after load here")
    ap.add_argument("--screenshots", help="folder for one PNG per workflow as it opens, and the template browser")
    ap.add_argument("--fitted", action="store_true", help="also fit each workflow into view as the frontend does")
    ap.add_argument("--open-template", help="with --screenshots: then open this workflow from Browse Templates")
    ap.add_argument("--thumbnails", action="store_true", help="write workflows/<name>.jpg (the template card images)")
    ap.add_argument("--record-fixture", action="store_true", help=f"write {FIXTURE.relative_to(ROOT)}")
    ap.add_argument("--api", help="folder for each workflow's API form from app.graphToPrompt()")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    workflows = sorted((ROOT / "workflows").glob("*.json"))
    work = Path(tempfile.mkdtemp(prefix="real-frontend-"))
    server = start_server(Path(args.comfyui), args.python, args.port, work, args.front_end_root)
    result = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                        args=["--no-sandbox"])
            page = open_page(browser, args.port)
            result["frontend_version"] = page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ || null")
            if args.record_fixture:
                info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{args.port}/object_info").read())
                used = sorted({n["type"] for w in workflows for n in json.loads(w.read_text())["nodes"]}
                              | {t for t in info if t.startswith("Qwen3TTSMorph")} | {"Note", "MarkdownNote"})
                sizes = page.evaluate(SIZES_JS, used)
                sizes.update(frontend=result["frontend_version"], viewport=VIEWPORT, overlays=page.evaluate(OVERLAYS_JS),
                             how=f"python {Path(__file__).relative_to(ROOT)} --record-fixture")
                FIXTURE.write_text(json.dumps(sizes, indent=1, sort_keys=True) + "\n")
            if args.screenshots:
                shots = Path(args.screenshots)
                shots.mkdir(parents=True, exist_ok=True)
            for path in workflows:
                wf = json.loads(path.read_text())
                result[path.stem] = load(page, wf, path.stem)
                if args.screenshots:
                    save_png(page, shots / f"{path.stem}.png")
                if args.fitted:
                    result[path.stem]["fitted_scale"] = page.evaluate(FIT_VIEW_JS)
                    time.sleep(1.0)
                    if args.screenshots:
                        save_png(page, shots / f"{path.stem} (fitted).png")
                if args.api:
                    Path(args.api).mkdir(parents=True, exist_ok=True)
                    api = page.evaluate("async () => (await window.app.graphToPrompt()).output")
                    (Path(args.api) / f"{path.stem}.json").write_text(json.dumps(api, indent=1, sort_keys=True) + "\n")
            if args.thumbnails:
                for path in workflows:
                    thumbnail(page, json.loads(path.read_text()), path.stem, path.with_suffix(".jpg"))
            if args.screenshots:
                page.locator(".side-tool-bar-container").get_by_text("Templates").first.click()
                time.sleep(3)
                page.get_by_text(PACK_FOLDER).first.click()
                time.sleep(4)
                save_png(page, shots / "template_browser.png")
                if args.open_template:  # open one from its card, as a person does (frontend 1.49+ fits it)
                    page.get_by_text(args.open_template, exact=True).last.click()  # the card, not the tab
                    time.sleep(4)
                    result["from_templates"] = {"name": args.open_template, "ds": page.evaluate(DS_JS),
                                                "problems": page.evaluate(PROBLEMS_JS)}
                    save_png(page, shots / f"{args.open_template} (from templates).png")
            browser.close()
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
