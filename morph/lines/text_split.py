"""Split long text into segments at sentence boundaries, for one render per segment."""

from __future__ import annotations

import re

MAX_SEGMENT_CHARS = 500

# A sentence ends after . ! ? ; (and any closing quote or bracket) and white space, a CJK end mark, or a line break.
BOUNDARY = re.compile(r"(?<=[.!?;])\s+|(?<=[.!?;][\"'”’)\]])\s+|(?<=[。！？；])|\n+")
_CJK_ENDS = "。！？；"
CLAUSE = re.compile(r"(?<=[,，、:：])\s*")


def _pieces(text: str, max_chars: int):
    for sentence in (part.strip() for part in BOUNDARY.split(text)):
        if not sentence:
            continue
        if len(sentence) <= max_chars:
            yield sentence
            continue
        # An over-long sentence: break at clause marks, then at spaces, then hard.
        for clause in CLAUSE.split(sentence):
            while len(clause) > max_chars:
                cut = clause.rfind(" ", 0, max_chars)
                cut = cut if cut > 0 else max_chars
                yield clause[:cut].strip()
                clause = clause[cut:].strip()
            if clause:
                yield clause


def split_text(text: str, max_chars: int = MAX_SEGMENT_CHARS) -> list[str]:
    """Greedily pack whole sentences into segments of at most max_chars characters."""
    segments: list[str] = []
    for piece in _pieces(text, max_chars):
        # CJK sentences are written without a space between them
        sep = "" if segments and segments[-1][-1] in _CJK_ENDS else " "
        if segments and len(segments[-1]) + len(sep) + len(piece) <= max_chars:
            segments[-1] = f"{segments[-1]}{sep}{piece}"
        else:
            segments.append(piece)
    return segments
