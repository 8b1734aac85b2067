"""The prose in morph/ stays at the size of the code: docstrings at most 10% of its lines, and morph/ within its line
budget (MAX_LINES)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MORPH = ROOT / "morph"
# Issue 79 aimed at 10,000 with every feature kept and missed: its closing note says what bounds it. The budget holds
# what morph/ is now, so that new code comes with cuts elsewhere or raises this number on purpose.
MAX_LINES = 10_400
MAX_DOC_SHARE = 0.10
DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(source: str) -> int:
    """Lines spanned by the module's, classes' and functions' docstrings."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, DOC_OWNERS) and ast.get_docstring(node, clean=False) is not None:
            doc = node.body[0]
            count += doc.end_lineno - doc.lineno + 1
    return count


def prose() -> dict[str, tuple[int, int]]:
    """{path under the root: (lines, docstring lines)} for every module of morph/."""
    counts = {}
    for path in sorted(MORPH.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        counts[str(path.relative_to(ROOT))] = (len(source.splitlines()), docstring_lines(source))
    return counts


def table(counts: dict[str, tuple[int, int]]) -> str:
    rows = sorted(counts.items(), key=lambda item: -item[1][1])
    return "\n".join(f"{docs:5d} of {lines:5d}  {path}" for path, (lines, docs) in rows)


def test_docstring_lines_are_counted_over_their_whole_span():
    source = (
        '"""Module,\non two lines."""\n\n'
        'class A:\n    """One."""\n\n'
        '    def f(self):\n        """Three\n\n    lines."""\n        x = """not a docstring"""\n'
    )
    assert docstring_lines(source) == 2 + 1 + 3


def test_docstrings_are_at_most_a_tenth_of_morph():
    counts = prose()
    lines, docs = (sum(column) for column in zip(*counts.values()))
    assert docs <= MAX_DOC_SHARE * lines, (
        f"morph/ has {docs} docstring lines of {lines} ({docs / lines:.1%}, at most {MAX_DOC_SHARE:.0%}): "
        f"say what and why in a few lines; figures go to docs/performance.md\n{table(counts)}")


def test_morph_stays_within_its_line_budget():
    counts = prose()
    lines = sum(lines for lines, _ in counts.values())
    assert lines <= MAX_LINES, f"morph/ has {lines} lines (at most {MAX_LINES:,})\n{table(counts)}"
