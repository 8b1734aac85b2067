"""The layout stays layered: no import cycle, no import pointing up the layers (docs/architecture.md draws them).

Every import in morph/, nodes/ and postprocess/ counts: module level, inside functions and under
`if TYPE_CHECKING:`, absolute and relative (the pack's root is itself a package, so nodes/ reaches the
engine as `..morph`). A module may import its own group and any lower rank; sibling groups of one rank do
not import each other; postprocess/ and morph/ know nothing of each other, and morph/ nothing of the nodes
or ComfyUI.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("morph", "nodes", "postprocess")

# (module prefix, rank, group), lowest rank first; a module belongs to its longest matching prefix.
LAYERS = (
    ("morph.settings", 0, "records"), ("morph.errors", 0, "records"),
    ("postprocess", 0, "postprocess"),
    ("morph.lines", 1, "lines"), ("morph.qwen", 1, "qwen"), ("morph.kernels", 1, "kernels"),
    ("morph.graphs", 1, "graphs"), ("morph.masked_attention", 1, "attention"),
    ("morph.decode", 2, "decode"), ("morph.codec", 2, "codec"),
    ("morph.api", 3, "top"), ("morph.render", 3, "top"), ("morph.memory", 3, "top"), ("morph", 3, "top"),
    ("nodes", 4, "nodes"),
)
# Imports that no rank allows: (importer prefix, imported prefix).
FORBIDDEN = (
    ("morph", "nodes"), ("morph", "postprocess"), ("postprocess", "morph"), ("postprocess", "nodes"),
    ("morph", "comfy"), ("morph", "comfy_execution"), ("morph", "server"), ("morph", "folder_paths"),
    # the frame step knows nothing of upstream's classes: reference/patch.py is the one seam to them
    ("morph.decode", "morph.qwen"),
    # the engine sits under the front ends that submit to it, and what sizes it (memory.py) under the engine
    ("morph.engine", "morph.render"), ("morph.engine", "morph.api"), ("morph.engine", "morph.script_job"),
    ("morph.engine", "morph.distributed"), ("morph.engine", "morph.serve"), ("morph.memory", "morph.engine"),
)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: modules it imports}: the pack's own modules resolved to the deepest one that exists, and
    other top-level names (torch, comfy, ...) as they are."""
    files = {_module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets |= {_resolve(a.name, files) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".") if package else []
                    anchor = anchor[:len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets |= {_resolve(f"{base}.{a.name}" if base else a.name, files) for a in node.names}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def _resolve(dotted: str, files) -> str:
    """The deepest of the pack's modules that `dotted` names (a name imported from a module is the module)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in files:
            return ".".join(parts[:n])
    return parts[0]


def layer_of(module: str, layers=LAYERS):
    matches = [(prefix, rank, group) for prefix, rank, group in layers if _within(module, prefix)]
    return max(matches, key=lambda m: len(m[0]))[1:] if matches else None


def violations(graph: dict[str, set[str]], layers=LAYERS, forbidden=FORBIDDEN) -> list[str]:
    """Every import that points up the layers, across a rank, or into a forbidden package."""
    found = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if any(_within(source, a) and _within(target, b) for a, b in forbidden):
                found.append(f"{source} -> {target}: forbidden")
                continue
            here, there = layer_of(source, layers), layer_of(target, layers)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] >= here[0]:
                found.append(f"{source} -> {target}: {there[1]} (rank {there[0]}) is not below {here[1]} "
                             f"(rank {here[0]})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among the graph's own modules (strongly connected components, Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_imports_point_down_the_layers():
    assert violations(import_graph()) == []


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer_of(m) is None] == []


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "morph.reference.patch" in graph["morph.api"]  # relative, module level
    assert "morph.kernels.snake" in graph["morph.reference.patch"]  # relative, inside a function
    assert "morph.render" in graph["nodes.batch"]  # `from ..morph.render import ...` from the nodes
    assert "torch" in graph["morph.graphs"]


def test_the_checker_reports_a_cycle_an_upward_import_and_a_forbidden_one(tmp_path):
    """On a synthetic package: the checks can fail."""
    files = {
        "morph/__init__.py": "",
        "morph/settings.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .api import X\n",
        "morph/api.py": "def f():\n    from morph import settings\n",
        "morph/decode/__init__.py": "",
        "morph/decode/step.py": "from ..qwen import compat\n",
        "morph/qwen/__init__.py": "",
        "morph/qwen/compat.py": "import nodes.batch\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("morph",))
    assert cycles(graph) == [["morph.api", "morph.settings"]]
    assert violations(graph) == [
        "morph.decode.step -> morph.qwen.compat: forbidden",
        "morph.qwen.compat -> nodes: forbidden",
        "morph.settings -> morph.api: top (rank 3) is not below records (rank 0)",
    ]
