"""Layout rules a test keeps: bench/results/ holds results (data) and no scripts; no module of the engine,
the nodes or the tools is over about 600 lines (the developers' guide: one concept a file, never split just to fit a
count), so that each is one a reader can hold; and nodes/services.py is the
only module of the pack that imports ComfyUI (its docstring's contract), lazily."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
CODE_FOLDERS = ("morph", "nodes", "tools")


def files_under(folder: str) -> list[Path]:
    """The files of `folder` the repository holds: git's list in a checkout (a worktree's .git is a file),
    else what is on disk (an unpacked release)."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout
        return [ROOT / p for p in listed.split("\0") if p and (ROOT / p).is_file()]
    return [p for p in (ROOT / folder).rglob("*") if p.is_file()]


def test_bench_results_hold_no_scripts():
    scripts = [p.relative_to(ROOT).as_posix() for p in files_under("bench/results") if p.suffix in (".py", ".sh")]
    assert not scripts, ("bench/results/ is for results; a script that measures something worth measuring again "
                         f"belongs in bench/ (documented there), a one-off in the history only: {scripts}")


def test_no_module_is_over_600_lines():
    over = {}
    for folder in CODE_FOLDERS:
        for path in files_under(folder):
            if path.suffix == ".py":
                lines = len(path.read_text(encoding="utf-8").splitlines())
                if lines > MAX_LINES:
                    over[path.relative_to(ROOT).as_posix()] = lines
    assert not over, f"over {MAX_LINES} lines, split them by what they hold: " + ", ".join(
        f"{name} ({lines})" for name, lines in sorted(over.items()))


COMFY_MODULES = {"comfy", "comfy_execution", "comfy_extras", "comfy_api", "folder_paths", "server", "execution",
                 "node_helpers", "latent_preview"}


def comfy_names(tree: ast.AST) -> list[str]:
    """The ComfyUI modules a syntax tree names: in import statements, or as the string a call imports by name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            found.append(node.args[0].value)
    return [name for name in found if name.split(".")[0] in COMFY_MODULES]


def test_services_is_the_only_module_that_imports_comfyui():
    trees = {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
             for folder in ("morph", "nodes") for p in files_under(folder) if p.suffix == ".py"}
    assert {name for name, tree in trees.items() if comfy_names(tree)} == {"nodes/services.py"}
    # and lazily, inside the functions that need them, so that the pack imports without ComfyUI
    assert not [n for n in trees["nodes/services.py"].body if isinstance(n, (ast.Import, ast.ImportFrom))
                and comfy_names(n)]
