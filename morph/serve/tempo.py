"""A reply's `speed`: its audio faster or slower at the same pitch, by FFmpeg's `atempo` through PyAV (docs/serving.md,
Requests). A Stretch keeps its state between a stream's chunks, so a stream and a whole file stretch alike."""

from __future__ import annotations

import math
from fractions import Fraction

import av
import av.filter
import numpy as np

from ..settings import SAMPLE_RATE

MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range
_BLENDED = (0.5, 2.0)  # the speeds one atempo reaches by blending windows; beyond, it skips samples, so two run
# atempo holds back a partly filled output frame of the input's size, so a chunk goes in as short pieces: what is
# ready leaves a window behind its input, not a whole chunk
_FRAME = 960


class Stretch:
    """One reply's audio at `speed`: `feed` a chunk for what is ready of it stretched, `finish` for the rest."""

    def __init__(self, speed: float):
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed: {speed} is out of range; send {MIN_SPEED} to {MAX_SPEED}")
        self.speed, self._pts, self._graph = speed, 0, None
        if speed == 1.0:
            return
        steps = [speed] if _BLENDED[0] <= speed <= _BLENDED[1] else [math.sqrt(speed)] * 2
        graph = av.filter.Graph()
        source = graph.add_abuffer(format="flt", sample_rate=SAMPLE_RATE, layout="mono",
                                   time_base=Fraction(1, SAMPLE_RATE))
        graph.link_nodes(source, *(graph.add("atempo", repr(step)) for step in steps), graph.add("abuffersink"))
        graph.configure()
        self._graph = graph

    def feed(self, audio: np.ndarray) -> np.ndarray:
        if self._graph is None:
            return audio
        audio = np.asarray(audio, np.float32)
        out = []
        for start in range(0, audio.size, _FRAME):
            piece = audio[start:start + _FRAME]
            frame = av.AudioFrame.from_ndarray(piece.reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = SAMPLE_RATE, self._pts, Fraction(1, SAMPLE_RATE)
            self._pts += piece.size
            self._graph.push(frame)
            out.append(self._ready())
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def finish(self) -> np.ndarray:
        if self._graph is None:
            return np.zeros(0, np.float32)
        self._graph.push(None)
        return self._ready()

    def _ready(self) -> np.ndarray:
        out = []
        while True:
            try:
                out.append(self._graph.pull().to_ndarray().reshape(-1))
            except (av.error.BlockingIOError, av.error.EOFError):  # nothing more until the next chunk, or the end
                return np.concatenate(out) if out else np.zeros(0, np.float32)


def stretched(audio: np.ndarray, speed: float) -> np.ndarray:
    """A whole clip at `speed`."""
    stretch = Stretch(speed)
    return np.concatenate([stretch.feed(audio), stretch.finish()])
