"""One worker of a distributed script job: a model loaded once, rendering the batches the driver sends it.

Ray runs it as a plain actor (job.py), one per GPU. A plain actor runs every call on the thread that built it, the
one that loaded the model and captured its CUDA graphs (Ray Data's actors call from another thread, and measured
slower). Each line's file is written here, where its audio is; only (script index, samples) go back to the driver.
"""

from __future__ import annotations

import os
import socket
from typing import Callable, Sequence

import numpy as np

from ..continuous import continuous_for
from ..api import MorphTTS
from ..lines.store import LineFiles, Written
from ..lines.voice import Voice
from ..render import BatchTTS, Line
from ..script_job import render_context
from ..settings import GenerationSettings


class LineWorker:
    def __init__(self, load: dict):
        import transformers

        # this process is the job's own: transformers' per-load bars would only repeat through Ray's log
        transformers.utils.logging.disable_progress_bar()
        self.tts = MorphTTS.load(**load)

    def about(self) -> dict:
        """What the driver checks and reports: the model kind, where it runs, and which process this is."""
        return dict(variant=self.tts.variant, device=str(self.tts.device), host=socket.gethostname(), pid=os.getpid())

    def context(self, language: str, settings: GenerationSettings, smoothing: bool) -> dict:
        return render_context(self.tts, self.tts.device.type, language, settings, smoothing)

    def voice_from_clip(self, clip: np.ndarray, transcript: str | None, who: str) -> Voice:
        return self.tts.voice_from_clip(clip, transcript, who=who)

    def check(self, lines: Sequence[Line], settings: GenerationSettings, who: str, labels: Sequence[str]) -> None:
        BatchTTS(self.tts).check(lines, settings, who, labels)

    def render(self, batch: Sequence[tuple[int, str, Line]], files: LineFiles, settings: GenerationSettings,
               finish_line: Callable[[np.ndarray], np.ndarray] | None, who: str, labels: Sequence[str],
               batching: str) -> list[tuple[int, Written]]:
        """One planned batch of (script index, character name, line), rendered as one batch (`batching`, one of
        BATCHING, as this worker's speed mode runs it: continuous_for) in the order given; each line's file written;
        returns (script index, the file written) per line."""
        audio = BatchTTS(self.tts).render([line for _, _, line in batch], settings, batch_size=len(batch),
                                          who=who, sort=False, labels=labels,
                                          continuous=continuous_for(self.tts, batching, who))
        done = []
        for (index, name, _), wav in zip(batch, audio):
            wav = finish_line(wav) if finish_line is not None else wav
            done.append((index, files.write_line(index + 1, name, wav)))
        return done
