"""A line to speak, and a row: what one pass of the decoder speaks (a line, or one segment of a long one)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .voice import Voice


@dataclass(frozen=True)
class Line:
    """One text of upstream's generate_*, spoken by a Voice (Base model), a built-in speaker with an optional instruct
    (CustomVoice), or an instruct alone (VoiceDesign)."""

    text: str
    voice: Voice | None = None  # the speech server's HTTP process holds its file's bytes (morph/engine/process.py)
    language: str = "Auto"
    speaker: str | None = None
    instruct: str = ""

    @property
    def variant(self) -> str:
        if self.voice is not None:
            return "base"
        return "voice_design" if self.speaker is None else "custom_voice"

    def identity(self) -> tuple:
        """Who speaks this line, how and in which language, for its random stream (a row adds its text)."""
        voice = None
        if self.voice is not None:
            h = hashlib.blake2b(self.voice.spk_embedding.float().numpy().tobytes(), digest_size=8)
            if self.voice.ref_code is not None:
                h.update(self.voice.ref_code.numpy().tobytes())
            voice = (h.hexdigest(), self.voice.ref_text)
        return voice, self.language, self.speaker, self.instruct


@dataclass(frozen=True)
class Row:
    """One row of a batch: a line, or one segment of a line too long for one pass."""

    index: int  # into the lines given
    segment: int
    text: str
    line: Line
    where: str  # the node, and which line, for messages
    limit: int  # the most frames of this row (max_new_tokens)
    # its talker prompt (prompts.RowPrompt), when built ahead of its join off the engine's thread (LiveEngine.submit)
    prompt: object = field(default=None, compare=False, repr=False)
