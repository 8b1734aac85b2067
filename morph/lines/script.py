"""Dialogue scripts (docs/scripts.md): one `Name: text` per spoken line, the name (before the first ':' or '：') matched
in any case; blank lines and `#` comments are skipped. One ValueError lists every problem by line number."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .words import FOR_PYTHON, Words

_NAME_AND_TEXT = re.compile(r"^([^:：]*)[:：](.*)$", re.DOTALL)
MAX_REPORTED = 10  # problems listed in one error; the rest are counted
MAX_NAME_CHARS = 60


@dataclass(frozen=True)
class ScriptLine:
    number: int  # 1-based line number in the script text
    name: str  # the speaker's display name, as the voice bank spells it
    text: str  # what they say, stripped


def name_key(name: str) -> str:
    return " ".join(str(name).split()).casefold()


def check_name(name: str, who: str = "Voice bank") -> str:
    """A character name usable in a script; returns it stripped."""
    shown = " ".join(str(name).split())
    if not shown:
        raise ValueError(f"{who}: the character name is empty; type the name used in the script, e.g. Alice")
    if ":" in shown or "：" in shown or shown.startswith("#"):
        raise ValueError(f"{who}: the character name {shown!r} cannot hold ':' or start with '#' (scripts are "
                         "written 'Name: text'); choose a name without them")
    if len(shown) > MAX_NAME_CHARS:
        raise ValueError(f"{who}: the character name {shown[:20]!r}... is {len(shown)} characters; "
                         f"use at most {MAX_NAME_CHARS}")
    return shown


def _quote(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_script(script: str, names: Iterable[str], words: Words = FOR_PYTHON) -> list[ScriptLine]:
    """The spoken lines in script order; `names` are the known display names, matched by `name_key`."""
    if not isinstance(script, str):
        raise ValueError(f"the script must be text, got {type(script).__name__}")
    known: dict[str, str] = {}
    for name in names:
        known.setdefault(name_key(name), " ".join(str(name).split()))
    known_list = ", ".join(sorted(known.values(), key=str.casefold)) or "(none)"

    lines: list[ScriptLine] = []
    problems: list[str] = []
    unknown = False
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME_AND_TEXT.match(line)
        if match is None or not match.group(1).strip():
            problems.append(f"line {number} ({_quote(line)}) does not start with 'Name:'; write it as Name: text, "
                            "or start it with # to make it a comment")
            continue
        name, text = " ".join(match.group(1).split()), match.group(2).strip()
        if name_key(name) not in known:
            unknown = True
            problems.append(f"line {number}: unknown character {_quote(name)}")
            continue
        if not text:
            problems.append(f"line {number}: {name} has nothing to say after '{name}:'; write the line's text, "
                            "or start the line with # to skip it")
            continue
        lines.append(ScriptLine(number, known[name_key(name)], text))

    if problems:
        shown = problems[:MAX_REPORTED]
        if len(problems) > MAX_REPORTED:
            shown.append(f"and {len(problems) - MAX_REPORTED} more")
        message = "the script has problems: " + "; ".join(shown)
        if unknown:
            message += f". Known characters: {known_list}; fix the spelling or {words.add_names}"
        raise ValueError(message)
    if not lines:
        raise ValueError("the script has no spoken lines; write one line per spoken line as Name: text "
                         f"(known characters: {known_list})")
    return lines
