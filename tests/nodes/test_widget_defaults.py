"""The nodes' widget defaults against the two places users read them from: the shipped workflows (which leave
every tuning knob at its default, so a changed default must show there) and the README's stated defaults.

A default changed in a node alone passed every other test: the workflows' widget values are only checked to be in
range, and nothing read the README's numbers.
"""

from __future__ import annotations

import json
import re

import pytest

from . import workflow_tools as wt
from .conftest import ROOT

WORKFLOWS = sorted((ROOT / "workflows").glob("*.json"))

# What an example sets as its content, not as tuning: its words, voices, names, files, model, language and the
# fixed seed that makes a run repeatable. Every other widget of the pack's nodes is a knob left at its default.
CONTENT = {"text", "script", "instruct", "transcript", "language", "seed", "name", "voice", "speaker", "model",
           "filename_prefix"}
# Knobs an example sets away from the default on purpose: (workflow, node title) -> {widget: value}.
ON_PURPOSE = {("Compare seq_groups 15 and 5", "Generate: seq_groups 15 (closest to upstream)"): {"seq_groups": 15}}


@pytest.fixture(scope="module")
def info(pack):
    return wt.combined_object_info(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS)


def defaults(info: dict, node_type: str) -> dict:
    return {name: opts["default"] for name, t, opts, _ in wt.input_specs(info[node_type])
            if wt.is_widget(t, opts) and "default" in opts}


def knobs(wf: dict, info: dict):
    """(node title, widget, saved value, default) of every tuning widget of the pack's nodes in a workflow."""
    for node in wf["nodes"]:
        if not node["type"].startswith("Qwen3TTSMorph"):
            continue
        title = node.get("title") or info[node["type"]]["display_name"]
        layout = wt.widget_layout(info[node["type"]])
        for (name, kind, _, opts), value in zip(layout, node["widgets_values"], strict=True):
            if kind == "input" and name not in CONTENT:
                yield title, name, value, opts["default"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflows_leave_every_knob_at_the_nodes_default(path, info):
    """A default changed in a node (or a knob changed in an example by accident) shows here as a mismatch."""
    wf = json.loads(path.read_text())
    checked = list(knobs(wf, info))
    assert checked, "every example has knobs of the pack's nodes"
    wrong = []
    for title, name, value, default in checked:
        want = ON_PURPOSE.get((path.stem, title), {}).get(name, default)
        if value != want:
            wrong.append(f"{title}.{name} = {value!r}, the node's default is {default!r}")
    assert wrong == []


def test_the_examples_cover_every_knob_and_set_only_the_listed_ones_on_purpose(info):
    """Not a check of nothing: the workflows together reach every tuning widget of every node they use (so each
    default is compared somewhere), and each on-purpose value really differs from its default."""
    seen, types = set(), set()
    for path in WORKFLOWS:
        wf = json.loads(path.read_text())
        types |= {n["type"] for n in wf["nodes"] if n["type"].startswith("Qwen3TTSMorph")}
        for title, name, value, default in knobs(wf, info):
            seen.add(name)
            if name in ON_PURPOSE.get((path.stem, title), {}):
                assert value != default, f"{path.stem}: {title}.{name} is the default, drop it from ON_PURPOSE"
    every = {name for t in types for name in defaults(info, t)} - CONTENT
    assert every - seen == set()
    assert {"seq_groups", "temperature", "top_k", "repetition_penalty", "subtalker_temperature", "cutoff_hz",
            "target_dbfs", "batch_size", "pause_seconds", "resume", "split_long_text", "speed_mode"} <= seen
    for (stem, title), values in ON_PURPOSE.items():
        assert (ROOT / "workflows" / f"{stem}.json").is_file(), stem
        assert values, (stem, title)


# The README's stated defaults: (pattern, node, widget, how the captured text reads as a value). Each pattern
# must match; a reworded README fails here until its pattern follows.
README_CLAIMS = [
    (r"`seq_groups` \(1-15, default (\d+)\)", "Qwen3TTSMorphGenerate", "seq_groups", int),
    (r"default\s+`seq_groups` (\d+) trades", "Qwen3TTSMorphGenerate", "seq_groups", int),
    (r"`batch_size` lines at once \(default (\d+);", "Qwen3TTSMorphRenderLines", "batch_size", int),
    (r"\| 8 GB \| (\d+) \(the default\)", "Qwen3TTSMorphRenderLines", "batch_size", int),
    (r"under\s+`filename_prefix`\s+\(default `([^`]+)`\)", "Qwen3TTSMorphRenderLines", "filename_prefix", str),
    (r"With `resume` (on) \(the default\)", "Qwen3TTSMorphRenderLines", "resume", lambda s: s == "on"),
    (r"A (\d)\w\w-order Butterworth low-pass", "Qwen3TTSMorphSmooth", "order", int),
    (r"Butterworth low-pass \((\d+) kHz\)", "Qwen3TTSMorphSmooth", "cutoff_hz", lambda s: float(s) * 1000),
    (r"and a (-?\d+(?:\.\d+)?) dBFS peak normalisation", "Qwen3TTSMorphSmooth", "target_dbfs", float),
    (r"dtype (\w+)/bf16/fp16/fp32", "Qwen3TTSMorphLoadModel", "dtype", str),  # the first choice named is the default
    (r"attention (\w+)/sdpa/", "Qwen3TTSMorphLoadModel", "attention", str),
]


@pytest.mark.parametrize("pattern, node, widget, read", README_CLAIMS, ids=[f"{c[1]}.{c[2]}" for c in README_CLAIMS])
def test_readme_states_the_nodes_defaults(pattern, node, widget, read, info):
    readme = (ROOT / "README.md").read_text()
    found = re.findall(pattern, readme)
    assert found, f"README no longer says {pattern!r}: say the default again, or follow the rewording here"
    default = defaults(info, node)[widget]
    for text in found:
        assert read(text) == default, f"README says {widget} defaults to {text!r}; {node} has {default!r}"
