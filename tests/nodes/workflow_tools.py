"""Check ComfyUI workflows without ComfyUI: object_info for V1 nodes, UI-format checks, UI -> API
conversion, and the checks POST /prompt makes (ComfyUI 0.8.0, execution.validate_prompt). The core nodes' schemas are
ComfyUI 0.33.0's GET /object_info (tests/fixtures/object_info_core_audio.json): from 0.25 on, Save Audio (Advanced) is
the save node and the per-format ones are deprecated.

One object_info dict (the shape of GET /object_info) describes every node type, ours and core,
so a single validator serves both.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
# A V3 node's combo whose choice may bring inputs of its own (Save Audio (Advanced)'s format: mp3 brings a quality);
# saved as its chosen key. The examples choose options that bring none.
DYNAMIC_COMBO = "COMFY_DYNAMICCOMBO_V3"
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}
# Widgets the frontend adds on its own, and what it saves for them in widgets_values.
UPLOAD_EXTRAS = {"audio_upload": [("audioUI", "AUDIO_UI", None), ("upload", "AUDIOUPLOAD", "")]}
AUDIO_UI_NODES = {"SaveAudio", "PreviewAudio", "SaveAudioMP3", "SaveAudioOpus", "SaveAudioAdvanced", "RecordAudio"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Nodes that live only in the frontend (not in /object_info): a text box, never sent to the server.
FRONTEND_ONLY = {"Note", "MarkdownNote"}


# -- object_info ----------------------------------------------------------------------------
def node_info(node_id: str, cls, display_name: str) -> dict:
    """What ComfyUI's server reports for a V1 node class (server.py node_info)."""
    inputs = cls.INPUT_TYPES()
    info = {
        "input": inputs,
        "input_order": {k: list(v.keys()) for k, v in inputs.items()},
        "output": list(cls.RETURN_TYPES),
        "output_is_list": list(getattr(cls, "OUTPUT_IS_LIST", [False] * len(cls.RETURN_TYPES))),
        "output_name": list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)),
        "name": node_id,
        "display_name": display_name,
        "description": getattr(cls, "DESCRIPTION", ""),
        "python_module": "custom_nodes.qwen3-tts-morph",
        "category": getattr(cls, "CATEGORY", "sd"),
        "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
    }
    if hasattr(cls, "OUTPUT_TOOLTIPS"):
        info["output_tooltips"] = list(cls.OUTPUT_TOOLTIPS)
    validate = getattr(cls, "VALIDATE_INPUTS", None)
    # Not part of /object_info: which inputs a node validates itself (ComfyUI skips its own checks for those).
    info["_self_validated"] = [] if validate is None else inspect.getfullargspec(validate).args
    info["_validate"] = validate
    return info


def core_object_info() -> dict:
    return json.loads((FIXTURES / "object_info_core_audio.json").read_text())


def combined_object_info(mappings: dict, display_names: dict) -> dict:
    info = core_object_info()
    for node_id, cls in mappings.items():
        info[node_id] = node_info(node_id, cls, display_names[node_id])
    return info


# -- input specs ----------------------------------------------------------------------------
def input_specs(info: dict) -> list[tuple[str, object, dict, str]]:
    """(name, type, options, category) of every required and optional input, in order."""
    specs = []
    for category in ("required", "optional"):
        section = info["input"].get(category, {})
        for name in info.get("input_order", {}).get(category, list(section)):
            spec = section[name]
            specs.append((name, spec[0], spec[1] if len(spec) > 1 else {}, category))
    return specs


def type_name(t) -> str:
    return "COMBO" if isinstance(t, list) or t == DYNAMIC_COMBO else t


def combo_options(t, opts: dict) -> list | None:
    if isinstance(t, list):
        return t
    if t == "COMBO":
        return opts.get("options", [])
    if t == DYNAMIC_COMBO:
        return [option["key"] for option in opts.get("options", [])]
    return None


def is_widget(t, opts: dict) -> bool:
    return type_name(t) in WIDGET_TYPES and not opts.get("forceInput")


def widget_layout(info: dict) -> list[tuple[str, str, object, dict]]:
    """What a node's widgets_values holds, in order: (name, kind, type, options).

    kind is "input" (an input widget), "control" (the value control_after_generate adds after a
    seed), or "extra" (a frontend-only widget such as the upload button; its saved value in options).
    """
    layout = []
    for name, t, opts, _ in input_specs(info):
        if not is_widget(t, opts):
            continue
        layout.append((name, "input", t, opts))
        if opts.get("control_after_generate"):
            layout.append((f"{name}:control_after_generate", "control", "COMBO", {}))
        for flag, extras in UPLOAD_EXTRAS.items():
            if opts.get(flag):
                layout += [(n, "extra", ftype, {"saved": v}) for n, ftype, v in extras]
    return layout


def value_problem(value, t, opts: dict, self_validated: bool = False) -> str | None:
    """Why `value` is not acceptable for a widget of type t, or None."""
    kind = type_name(t)
    if kind == "INT":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an INT"
    elif kind == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{value!r} is not a FLOAT"
    elif kind == "BOOLEAN":
        if not isinstance(value, bool):
            return f"{value!r} is not a BOOLEAN"
    elif kind == "STRING":
        if not isinstance(value, str):
            return f"{value!r} is not a STRING"
    elif kind == "COMBO":
        options = combo_options(t, opts)
        if self_validated or opts.get("audio_upload") or opts.get("image_upload"):
            # the node validates it itself / the list is the server's input folder at run time
            if not isinstance(value, str):
                return f"{value!r} is not a file name"
        elif value not in options:
            return f"{value!r} is not one of {options}"
    if kind in ("INT", "FLOAT") and not self_validated:
        if "min" in opts and value < opts["min"]:
            return f"{value} is below the minimum {opts['min']}"
        if "max" in opts and value > opts["max"]:
            return f"{value} is above the maximum {opts['max']}"
    return None


def types_match(received: str, expected: str) -> bool:
    """comfy_execution.validation.validate_node_input, non-strict."""
    if received == expected or "*" in (received, expected):
        return True
    return bool({t.strip() for t in received.split(",")} & {t.strip() for t in expected.split(",")})


# -- UI format --------------------------------------------------------------------------------
def check_ui_workflow(wf: dict, info: dict) -> list[str]:
    """Problems the frontend would show on load (missing nodes, widgets that do not fit, bad links)."""
    errors = []
    for key in ("last_node_id", "last_link_id", "nodes", "links", "groups", "config", "extra", "version"):
        if key not in wf:
            errors.append(f"top level: no {key!r}")
    if wf.get("version") != 0.4:
        errors.append(f"version is {wf.get('version')!r}, not 0.4")
    nodes = {}
    for node in wf.get("nodes", []):
        for key in ("id", "type", "pos", "size", "flags", "order", "mode", "properties", "widgets_values"):
            if key not in node:
                errors.append(f"node {node.get('id')}: no {key!r}")
        if node["id"] in nodes:
            errors.append(f"node id {node['id']} is used twice")
        nodes[node["id"]] = node
    if nodes and wf.get("last_node_id", 0) < max(nodes):
        errors.append("last_node_id is below the largest node id")
    links = {}
    for link in wf.get("links", []):
        if len(link) != 6:
            errors.append(f"link {link}: not [id, src, src_slot, dst, dst_slot, type]")
            continue
        if link[0] in links:
            errors.append(f"link id {link[0]} is used twice")
        links[link[0]] = link
    if links and wf.get("last_link_id", 0) < max(links):
        errors.append("last_link_id is below the largest link id")

    for nid, node in nodes.items():
        where = f"node {nid} ({node['type']})"
        if node["type"] in FRONTEND_ONLY:
            values = node.get("widgets_values", [])
            if len(values) != 1 or not isinstance(values[0], str):
                errors.append(f"{where}: widgets_values must be [text], got {values!r}")
            if node.get("inputs") or node.get("outputs"):
                errors.append(f"{where}: a note has no inputs or outputs")
            continue
        spec = info.get(node["type"])
        if spec is None:
            errors.append(f"{where}: unknown node type (the frontend reports it missing)")
            continue
        if spec.get("deprecated"):
            errors.append(f"{where}: deprecated: the frontend shows it as {spec['display_name']!r} with a [DEPR] "
                          "badge; use the node that replaces it")
        layout = widget_layout(spec)
        values = node.get("widgets_values", [])
        if len(values) != len(layout):
            errors.append(f"{where}: {len(values)} widgets_values for {len(layout)} widgets "
                          f"{[name for name, *_ in layout]}")
        own_check = set(spec.get("_self_validated", []))
        for (name, kind, t, opts), value in zip(layout, values):
            if kind == "control":
                problem = None if value in CONTROL_VALUES else f"{value!r} is not one of {sorted(CONTROL_VALUES)}"
            elif kind == "extra":
                problem = None if value == opts["saved"] else f"{value!r} (the frontend saves {opts['saved']!r})"
            else:
                problem = value_problem(value, t, opts, name in own_check)
            if problem:
                errors.append(f"{where}: widget {name}: {problem}")
        # socket inputs
        sockets = {name: (t, cat) for name, t, opts, cat in input_specs(spec) if not is_widget(t, opts)}
        ui_inputs = node.get("inputs", [])
        by_name = {i["name"]: (slot, i) for slot, i in enumerate(ui_inputs)}
        for name, (t, cat) in sockets.items():
            if name not in by_name:
                errors.append(f"{where}: input {name} is not in the node's inputs")
            elif cat == "required" and by_name[name][1].get("link") is None:
                errors.append(f"{where}: required input {name} is not connected")
        known = {name for name, *_ in input_specs(spec)} | {n for n, *_ in widget_layout(spec)}
        if node["type"] in AUDIO_UI_NODES:
            known.add("audioUI")
        for slot, i in enumerate(ui_inputs):
            if i["name"] not in known:
                errors.append(f"{where}: input {i['name']} does not exist on this node")
            if i.get("link") is not None:
                link = links.get(i["link"])
                if link is None:
                    errors.append(f"{where}: input {i['name']} uses link {i['link']}, which does not exist")
                elif link[3] != nid or link[4] != slot:
                    errors.append(f"{where}: link {link[0]} says it ends at node {link[3]} slot {link[4]}, "
                                  f"but it is on slot {slot}")
        outs = node.get("outputs", [])
        if len(outs) != len(spec["output"]):
            errors.append(f"{where}: {len(outs)} outputs, the node has {len(spec['output'])}")
        for slot, o in enumerate(outs):
            if slot < len(spec["output"]) and o.get("type") != spec["output"][slot]:
                errors.append(f"{where}: output {slot} is typed {o.get('type')}, the node gives {spec['output'][slot]}")
            for lid in o.get("links") or []:
                if lid not in links or links[lid][1] != nid or links[lid][2] != slot:
                    errors.append(f"{where}: output {slot} lists link {lid}, which does not start there")

    for lid, (_, src, src_slot, dst, dst_slot, t) in links.items():
        if src not in nodes or dst not in nodes:
            errors.append(f"link {lid}: connects missing node {src if src not in nodes else dst}")
            continue
        s_spec, d_spec = info.get(nodes[src]["type"]), info.get(nodes[dst]["type"])
        if s_spec is None or d_spec is None:
            continue
        if src_slot >= len(s_spec["output"]):
            errors.append(f"link {lid}: node {src} has no output slot {src_slot}")
            continue
        out_type = s_spec["output"][src_slot]
        if out_type != t:
            errors.append(f"link {lid}: typed {t} but node {src}'s output {src_slot} is {out_type}")
        d_inputs = nodes[dst].get("inputs", [])
        if dst_slot >= len(d_inputs):
            errors.append(f"link {lid}: node {dst} has no input slot {dst_slot}")
            continue
        name = d_inputs[dst_slot]["name"]
        expected = {n: t2 for n, t2, _, _ in input_specs(d_spec)}.get(name)
        if expected is None or not types_match(out_type, type_name(expected)):
            errors.append(f"link {lid}: {out_type} into {nodes[dst]['type']}.{name} ({type_name(expected)})")
        if d_inputs[dst_slot].get("link") != lid:
            errors.append(f"link {lid}: node {dst}'s input {name} does not point back to it")
        if lid not in (nodes[src]["outputs"][src_slot].get("links") or []):
            errors.append(f"link {lid}: node {src}'s output {src_slot} does not list it")

    if not any(info.get(n["type"], {}).get("output_node") for n in nodes.values() if n.get("mode", 0) == 0):
        errors.append("no output node: the server would reject it (prompt_no_outputs)")
    return errors


def ui_to_api(wf: dict, info: dict) -> dict:
    """The API prompt the frontend's graphToPrompt makes: widget values by name, links as [id, slot]."""
    nodes = {n["id"]: n for n in wf["nodes"]}
    links = {link[0]: link for link in wf["links"]}
    prompt = {}
    for nid, node in nodes.items():
        if node.get("mode", 0) != 0 or node["type"] in FRONTEND_ONLY:  # muted (2), bypassed (4), notes: left out
            continue
        spec = info[node["type"]]
        inputs = {}
        for (name, kind, _, _), value in zip(widget_layout(spec), node["widgets_values"], strict=True):
            if kind == "input":
                inputs[name] = value
        for i in node.get("inputs", []):
            if i.get("link") is not None:
                _, src, src_slot, _, _, _ = links[i["link"]]
                inputs[i["name"]] = [str(src), src_slot]
        prompt[str(nid)] = {"class_type": node["type"], "inputs": inputs,
                            "_meta": {"title": node.get("title", spec.get("display_name", node["type"]))}}
    return prompt


# -- API format: what POST /prompt checks ------------------------------------------------------
def validate_prompt(prompt: dict, info: dict) -> list[str]:
    errors = []
    outputs = []
    for nid, node in prompt.items():
        if "class_type" not in node:
            return [f"#{nid}: no class_type"]
        if node["class_type"] not in info:
            return [f"#{nid}: node {node['class_type']} does not exist"]
        if info[node["class_type"]].get("output_node") is True:
            outputs.append(nid)
    if not outputs:
        return ["prompt has no outputs"]
    for nid, node in prompt.items():
        spec = info[node["class_type"]]
        where = f"#{nid} {node['class_type']}"
        own_check = set(spec.get("_self_validated", []))
        for name, t, opts, category in input_specs(spec):
            if name not in node["inputs"]:
                if category == "required":
                    errors.append(f"{where}: required input {name} is missing")
                continue
            value = node["inputs"][name]
            if isinstance(value, list):
                if len(value) != 2 or str(value[0]) not in prompt:
                    errors.append(f"{where}: {name}: bad link {value}")
                    continue
                src = info[prompt[str(value[0])]["class_type"]]
                if value[1] >= len(src["output"]):
                    errors.append(f"{where}: {name}: node {value[0]} has no output {value[1]}")
                    continue
                received = src["output"][value[1]]
                if not types_match(received, type_name(t)):
                    errors.append(f"{where}: {name}: received {received}, expected {type_name(t)}")
            else:
                problem = value_problem(value, t, opts, name in own_check)
                if problem:
                    errors.append(f"{where}: {name}: {problem}")
        validate = spec.get("_validate")
        if validate is not None:
            args = {a: node["inputs"][a] for a in spec["_self_validated"]
                    if a in node["inputs"] and not isinstance(node["inputs"][a], list)}
            result = validate(**args)
            if result is not True:
                errors.append(f"{where}: custom validation failed: {result}")
    return errors


# -- the frontend's missing-model check (frontend 1.49+, src/platform/missingModel/missingModelScan.ts) -------
# scanComboWidget: on load, a COMBO widget whose value ends in a model file suffix and is not among the
# widget's options is reported as a missing model (a toast, the node outlined red, a warning on Run),
# whatever the node is. Widgets whose input is linked and muted or bypassed nodes are skipped.
MODEL_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".onnx", ".gguf")


def missing_model_flags(wf: dict, info: dict) -> list[str]:
    """The combo values the frontend would flag as missing models when `info` lists what is installed."""
    flags = []
    for node in wf["nodes"]:
        if node["type"] in FRONTEND_ONLY or node.get("mode", 0) in (2, 4):
            continue
        linked = {i.get("widget", {}).get("name") for i in node.get("inputs", []) if i.get("link") is not None}
        values = iter(node.get("widgets_values", []))
        for name, kind, t, opts in widget_layout(info[node["type"]]):
            value = next(values, None)
            options = combo_options(t, opts)
            if kind != "input" or options is None or name in linked or not isinstance(value, str):
                continue
            if value.lower().endswith(MODEL_FILE_SUFFIXES) and value not in options:
                flags.append(f"node {node['id']} ({node['type']}) {name}={value!r}: the frontend reports a missing model")
    return flags


# -- layout: node boxes as ComfyUI's frontend draws them after loading a workflow -------------------
# On load the frontend widens every node to at least node.computeSize(): the title's width plus
# padding, the widest slot label and the widgets' minimums (app.loadGraphData in frontend 1.35.9).
# tests/fixtures/frontend_node_sizes.json records, from that frontend (tests/nodes/real_frontend.py
# --record-fixture), each node type's computeSize() without its title, the title font's character
# widths, and the overlays floating over the canvas.
def frontend_sizes() -> dict:
    return json.loads((FIXTURES / "frontend_node_sizes.json").read_text())


def text_width(text: str, sizes: dict) -> float:
    # LiteGraph's own fallback for a character it cannot measure: 0.6 x the 14 px font size.
    return sum(sizes["char_widths"].get(c, 14 * 0.6) for c in text)


def node_boxes(wf: dict, sizes: dict) -> dict:
    """{node id: (x, y, w, h)} in canvas units, title bar included, after the frontend's resize."""
    th = sizes["title_height"]
    boxes = {}
    for node in wf["nodes"]:
        rec = sizes["types"][node["type"]]
        title = node.get("title") or rec["default_title"]
        title_w = th + text_width(title, sizes) + th * 0.33  # LGraphNode.computeSize
        w = max(node["size"][0], rec["width_without_title"], title_w)
        h = max(node["size"][1], rec["height"])
        boxes[node["id"]] = (node["pos"][0], node["pos"][1] - th, w, h + th)
    return boxes


def stale_sizes(info: dict, sizes: dict, types) -> list[str]:
    """Node types whose widgets differ from the ones the recorded sizes were measured with."""
    problems = []
    for t in sorted(set(types)):
        rec = sizes["types"].get(t)
        if rec is None:
            problems.append(f"{t}: no recorded size")
        elif t in info:
            names = [name for name, kind, _, _ in widget_layout(info[t]) if kind == "input"]
            if [w for w in rec["widgets"] if w in names] != names:
                problems.append(f"{t}: widgets {names}, sizes recorded with {rec['widgets']}")
    return problems


# LiteGraph draws nodes without text below the zoom where their 14 px text would be under 8 px
# (LiteGraph.Canvas.MinFontSizeForLOD, default 8: 8 / 14 = 0.571), and a template opens fitted (below):
# keep every example's fitted zoom a little above that, where the text is still legible.
READABLE_FIT = 0.62


def fitted_view(wf: dict, sizes: dict, boxes: dict | None = None) -> tuple[float, float, float]:
    """(scale, offset x, offset y) a workflow opens at from Browse Templates in frontend 1.49+:
    app.loadGraphData calls useLitegraphService().fitView() for a template, which centres the nodes'
    bounds (10 px padding) in the canvas with ds.fitToBounds at its default zoom of 0.75."""
    boxes = boxes if boxes is not None else node_boxes(wf, sizes)
    x0 = min(x for x, y, w, h in boxes.values()) - 10
    y0 = min(y for x, y, w, h in boxes.values()) - 10
    x1 = max(x + w for x, y, w, h in boxes.values()) + 10
    y1 = max(y + h for x, y, w, h in boxes.values()) + 10
    view = sizes["viewport"]
    scale = 0.75 * min(view["width"] / max(x1 - x0, 300), view["height"] / max(y1 - y0, 300))
    return scale, view["width"] / 2 / scale - (x0 + x1) / 2, view["height"] / 2 / scale - (y0 + y1) / 2


def fitted_scale(wf: dict, sizes: dict, boxes: dict | None = None) -> float:
    return fitted_view(wf, sizes, boxes)[0]


def layout_problems(wf: dict, sizes: dict, boxes: dict | None = None, gap: float = 10) -> list[str]:
    """Nodes that overlap (closer than `gap`), sit under the sidebar or the top bars, run off the window
    or lie under the minimap when the workflow opens at its saved view (extra.ds; frontend 1.35 and any
    load that is not a template), or straddle a group's border; and a fitted zoom (a template's view in
    frontend 1.49+) too small to draw text."""
    boxes = boxes if boxes is not None else node_boxes(wf, sizes)
    titles = {n["id"]: f"node {n['id']} ({n.get('title') or n['type']})" for n in wf["nodes"]}
    problems = []
    ids = sorted(boxes)
    for i, a in enumerate(ids):
        ax, ay, aw, ah = boxes[a]
        for b in ids[i + 1:]:
            bx, by, bw, bh = boxes[b]
            if ax < bx + bw + gap and bx < ax + aw + gap and ay < by + bh + gap and by < ay + ah + gap:
                problems.append(f"{titles[a]} and {titles[b]} overlap or are closer than {gap} px")
    ds = wf.get("extra", {}).get("ds", {"scale": 1, "offset": [0, 0]})
    scale, (ox, oy) = ds.get("scale", 1), ds.get("offset", [0, 0])
    over = sizes["overlays"]
    left = over["sidebar"][2] + gap
    # the bars below the tabs: frontend 1.58 has no breadcrumb row at the root graph
    top = max(over[bar][3] for bar in ("tabs", "breadcrumb", "actionbar") if over[bar]) + gap
    view, minimap = sizes["viewport"], over.get("minimap")
    shown = [(titles[nid], box) for nid, box in boxes.items()]
    shown += [(f"group {g.get('title')!r}", g["bounding"]) for g in wf.get("groups", [])]
    for name, (x, y, w, h) in shown:
        sx, sy, sx1, sy1 = (x + ox) * scale, (y + oy) * scale, (x + w + ox) * scale, (y + h + oy) * scale
        if sx < left and not name.startswith("group"):
            problems.append(f"{name} starts at screen x {sx:.0f}, under the sidebar (clear from {left:.0f})")
        if sy < top and not name.startswith("group"):
            problems.append(f"{name} starts at screen y {sy:.0f}, under the top bars (clear from {top:.0f})")
        if sx1 > view["width"] - gap or sy1 > view["height"] - gap:
            problems.append(f"{name} ends at screen ({sx1:.0f}, {sy1:.0f}), off the {view['width']}x{view['height']} "
                            "window")
        if minimap and sx < minimap[2] + gap and minimap[0] - gap < sx1 and sy < minimap[3] + gap \
                and minimap[1] - gap < sy1:
            problems.append(f"{name} reaches under the minimap (screen {minimap[0]:.0f}, {minimap[1]:.0f} and below)")
    fit, fx, fy = fitted_view(wf, sizes, boxes)
    if fit < READABLE_FIT:
        problems.append(f"fitted zoom {fit:.2f} (a template's view) is below {READABLE_FIT}: nodes draw without text")
    for nid, (x, y, w, h) in boxes.items():
        if minimap and (x + fx) * fit < minimap[2] and minimap[0] < (x + w + fx) * fit \
                and (y + fy) * fit < minimap[3] and minimap[1] < (y + h + fy) * fit:
            problems.append(f"{titles[nid]} lies under the minimap in the fitted view (a template's view)")
    for group in wf.get("groups", []):
        gx, gy, gw, gh = group["bounding"]
        for nid, (x, y, w, h) in boxes.items():
            inside = gx <= x and gy <= y and x + w <= gx + gw and y + h <= gy + gh
            apart = x >= gx + gw or gx >= x + w or y >= gy + gh or gy >= y + h
            if not inside and not apart:
                problems.append(f"{titles[nid]} straddles the border of group {group.get('title')!r}")
    return problems
