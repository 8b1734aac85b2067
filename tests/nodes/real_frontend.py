"""The example workflows in a REAL ComfyUI frontend: node boxes after load, screenshots, thumbnails, and
the frontend's recorded node sizes (tests/fixtures/frontend_node_sizes.json) for the CPU layout check.

    python tests/nodes/real_frontend.py --comfyui /path/to/ComfyUI [--python /path/to/its/python]
        [--json boxes.json] [--screenshots DIR] [--fitted] [--thumbnails] [--record-fixture]
        [--front-end-root DIR/static] [--run NAME [--clip IDS]]

Starts ComfyUI (--cpu) with this repository as a custom node, opens its frontend in headless Chromium
(playwright's Python client, Debian's chromium: $CHROMIUM, default /usr/bin/chromium) and loads each
workflow in workflows/ with app.loadGraphData, as Browse Templates does. With --run, tiny random checkpoints
stand in under the model names that workflow loads and it runs as the Run button runs it; docs/images/ is taken
so (bench/results/cpu-comfyui-screenshot-2026-11-29/NOTES.md). Needs playwright in the Python that runs this script; ComfyUI runs in
--python (default: this one). test_real_comfy.py runs it when COMFYUI_PATH is set.
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
# --run's window, at device scale 2: the whole of the largest workflow at zoom 1, clear of the top bars.
PICTURE_VIEWPORT = {"width": 2400, "height": 1300}
PICTURE_AT = 140  # CSS px from the canvas's top left to the picture's: below the floating Graph button and toasts
RUN_TIMEOUT = 1800  # seconds: on the CPU, even with tiny checkpoints, the dialogue's lines run for minutes
HIDE_OVERLAYS_CSS = (".side-tool-bar-container, .workflow-tabs-container, .subgraph-breadcrumb, .actionbar-container, "
                     ".p-toast, .litegraph-minimap, div:has(> .litegraph-minimap) {visibility: hidden !important}")

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
# The picture's view: zoom 1, the chosen nodes' bounds (all when ids is empty; badges above titles included by the
# margin) at PICTURE_AT of the canvas; returns the page clip that holds them.
PICTURE_JS = """([ids, at, margin]) => {
  const c = window.app.canvas, b = [Infinity, Infinity, -Infinity, -Infinity];
  for (const n of window.app.graph.nodes) { if (ids.length && !ids.includes(String(n.id))) continue; const r = n.boundingRect;
    b[0] = Math.min(b[0], r[0]); b[1] = Math.min(b[1], r[1]); b[2] = Math.max(b[2], r[0] + r[2]); b[3] = Math.max(b[3], r[1] + r[3]); }
  c.ds.scale = 1;
  c.ds.offset = [at + margin - b[0], at + margin - b[1]];
  c.setDirty(true, true);
  const r = c.canvas.getBoundingClientRect();
  return {x: r.left + at, y: r.top + at, width: Math.ceil(b[2] - b[0] + 2 * margin), height: Math.ceil(b[3] - b[1] + 2 * margin)};
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


def open_page(browser, port: int, viewport: dict = VIEWPORT, device_scale: float = 1):
    page = browser.new_page(viewport=viewport, device_scale_factor=device_scale)
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


def save_png(page, path: Path, clip: dict | None = None) -> None:
    """A screenshot (of `clip` only, if given) as a 256-colour PNG: the UI is flat colours and text, so it stays
    legible and small."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(page.screenshot(clip=clip))).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def thumbnail(page, wf: dict, name: str, path: Path) -> None:
    """The whole graph fitted into the canvas, overlays hidden, saved as a JPEG card image."""
    import io

    from PIL import Image

    page.evaluate("async ([wf, name]) => { await window.app.loadGraphData(wf, true, false, name); }", [wf, name])
    page.add_style_tag(content=HIDE_OVERLAYS_CSS)
    page.evaluate(FIT_JS)
    time.sleep(1.0)
    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    image.thumbnail((640, 360))
    image.save(path, "JPEG", quality=82)
    page.reload(wait_until="networkidle")
    page.wait_for_function("window.app && window.app.graph", timeout=180000)
    time.sleep(1.0)


def wait_idle(port: int, seconds: float = 180) -> None:
    """Until ComfyUI's queue is empty (the job ran or failed)."""
    time.sleep(1.0)
    end = time.time() + seconds
    while time.time() < end:
        queue = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/queue").read())
        if not queue["queue_running"] and not queue["queue_pending"]:
            return
        time.sleep(0.5)
    raise TimeoutError("the job did not end")


def build_checkpoints(wf: dict, models: Path) -> None:
    """A tiny random checkpoint under each model name the workflow loads, of the variant the name says."""
    sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
    from comfy_gpu.install import VARIANT_OF, loaded_names

    from bench.random_model import build_random_model

    for name in sorted(loaded_names({"wf": wf})[0]):
        folder = name.split("/")[-1]
        build_random_model(models / folder, "tiny", next((v for k, v in VARIANT_OF.items() if k in folder), "base"))


def run_picture(browser, port: int, wf: dict, name: str, clips: list[str], shots: Path) -> dict:
    """Run the workflow as the Run button does, in a window at device scale 2; once the job has succeeded, save
    '<name> (after the run).png' of all its nodes at zoom 1, overlays hidden, and one more for each of `clips`
    (comma-separated node ids)."""
    page = open_page(browser, port, PICTURE_VIEWPORT, 2)
    page.evaluate("async ([wf, name]) => { await window.app.loadGraphData(wf, true, true, name); }", [wf, name])
    time.sleep(2.5)
    t0 = time.time()
    page.evaluate("async () => { await window.app.queuePrompt(0, 1); }")
    wait_idle(port, RUN_TIMEOUT)
    [job] = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/history?max_items=1").read()).values()
    if job["status"]["status_str"] != "success":
        raise RuntimeError(f"--run {name!r}: the job did not succeed: {json.dumps(job['status'])[-2000:]}")
    result = {"job_s": round(time.time() - t0, 1), "pictures": {}}
    time.sleep(3.0)  # the frontend's end-of-job clean-up
    page.add_style_tag(content=HIDE_OVERLAYS_CSS)
    for ids in ["", *clips]:
        clip = page.evaluate(PICTURE_JS, [[i for i in ids.split(",") if i], PICTURE_AT, 24])
        if clip["x"] + clip["width"] > PICTURE_VIEWPORT["width"] or clip["y"] + clip["height"] > PICTURE_VIEWPORT["height"]:
            raise RuntimeError(f"--run {name!r}: nodes {ids or 'all'} span {clip['width']}x{clip['height']} px at zoom 1, "
                               f"more than the {PICTURE_VIEWPORT} window holds; name fewer with --clip")
        time.sleep(1.5)  # the DOM widgets (text boxes, audio players) follow the view on the next frames
        path = shots / (f"{name} (after the run, nodes {ids}).png" if ids else f"{name} (after the run).png")
        save_png(page, path, clip)
        result["pictures"][path.name] = clip
    result["messages"] = page.evaluate("""() => window.app.graph.nodes.flatMap(n => (n.widgets || [])
      .filter(w => w.name === 'morph_messages').map(w => ({node: n.id, text: w.element.textContent})))""")
    page.close()
    return result


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
    ap.add_argument("--run", metavar="NAME", help="with --screenshots: then run this workflow with tiny random "
                    "checkpoints and save it after the run at zoom 1, device scale 2")
    ap.add_argument("--clip", action="append", default=[], metavar="IDS",
                    help="with --run: also save only these nodes (comma-separated ids); repeatable")
    args = ap.parse_args()
    if args.run and not args.screenshots:
        ap.error("--run saves its pictures into --screenshots DIR: give --screenshots")
    if args.clip and not args.run:
        ap.error("--clip picks nodes of --run's picture: give --run NAME")
    workflows = sorted((ROOT / "workflows").glob("*.json"))
    if args.run and not (ROOT / "workflows" / f"{args.run}.json").is_file():
        ap.error(f"--run {args.run!r}: no workflows/{args.run}.json; give one of {[w.stem for w in workflows]}")
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="real-frontend-"))
    if args.run:
        run_wf = json.loads((ROOT / "workflows" / f"{args.run}.json").read_text())
        build_checkpoints(run_wf, work / "models")
    server = start_server(Path(args.comfyui), args.python, args.port, work, args.front_end_root,
                          models=work / "models" if args.run else None)
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
            if args.run:
                result["run"] = run_picture(browser, args.port, run_wf, args.run, args.clip, shots)
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
