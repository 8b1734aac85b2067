"""The codec's decode replayed from CUDA graphs, one per call shape (rows, frames): what the continuous batch's rows
decode with in the fast modes (morph/codec/stream.py CodecStream).

The live rows make many small calls, each about 1,400 kernel launches from the frame loop's host thread
(morph/codec/calls.py): under a speech server's load those launches would be most of that thread's time (py-spy,
bench/results/h100-2026-11-25c). Their shapes are few, so each is captured once and replayed.
"""

from __future__ import annotations

import torch

from ..graphs import CODEC_CAPTURE, GraphCache
from .state import CodecState

MAX_SHAPES = 32  # graphs kept: two chunk sizes at up to 8 widths each, and the rest's sizes of ended rows


class CapturedDecode:
    """LeanCodec.decode for one device, a captured graph per (rows, frames) replayed (module docstring)."""

    def __init__(self, codec, device: torch.device):
        self.codec, self.device = codec, device
        # captured on a stream of their own: they replay beside the frame step's graphs (graphs.capture says why),
        # after one warm-up run, which plans cuDNN's convolutions and builds the activation's kernel: a 64-row call
        # runs for tens of ms, and a continuous render's first call captures about 20 shapes
        self.graphs = GraphCache(max_graphs=MAX_SHAPES, role=CODEC_CAPTURE, warmup=1)
        # rows -> the state the graphs of that many rows read and write: every call copies its rows' state in and
        # back out, and the graphs replay one after another on one stream, so the chunk sizes share it (a state per
        # shape would cost memory for nothing: bench/results/h200-2026-11-26d/NOTES.md)
        self._states: dict[int, CodecState] = {}

    def bind(self) -> torch.dtype:
        """Drop the graphs, and the states they read, if the codec's weights moved since their capture, or if a
        capture failed since the last bind (GraphCache.bind): a CodecStream binds as its batch starts, so that batch
        tries again. Returns the weights' dtype."""
        weights = next(self.codec.decoder.parameters())
        self.graphs.bind((self.device, weights.dtype, weights.data_ptr()))
        if not len(self.graphs):
            self._states.clear()
        return weights.dtype

    def decode(self, codes: torch.Tensor, state: CodecState) -> torch.Tensor:
        """What LeanCodec.decode(codes, state) gives, `state` advanced in place the same way; the audio is a copy,
        so a later replay of the same graph leaves it as it is."""
        entry = self.prepare(*codes.shape[:2])
        if entry is None:
            return self.codec.decode(codes, state)
        static_codes, static_state = entry.keep
        static_codes.copy_(codes)
        static_state.flat.copy_(state.flat)
        static_state.pos.copy_(state.pos)
        wav = entry.replay()
        state.flat.copy_(static_state.flat)
        state.pos.copy_(static_state.pos)
        return wav.clone()

    def prepare(self, rows: int, frames: int):
        """The graph of this call shape, captured on its first call (graphs.capture: warmed up, captured, replayed);
        None for the rest of the batch once a capture has failed (GraphCache.get_or_none)."""
        if self.graphs.failed:
            return None
        dtype = self.bind()  # the weights may have moved since the last call (a cast, an offload)
        key = (rows, frames)
        if key in self.graphs:
            return self.graphs.get(key, None)
        groups = int(self.codec.decoder.config.num_quantizers)
        codes = torch.zeros(rows, frames, groups, dtype=torch.long, device=self.device)
        if rows not in self._states:
            self._states[rows] = self.codec.zero_state(rows, self.device, dtype)
        state = self._states[rows]
        # the audio lands in a tensor made outside the capture: a tensor the capture allocated and kept would make
        # cudaMallocAsync warn once for each graph dropped ("uncaptured free of a captured allocation", in a ComfyUI
        # server's log at each unload)
        audio = torch.empty(rows, frames * self.codec.upsample, dtype=torch.float32, device=self.device)
        entry = self.graphs.get_or_none(key, lambda: audio.copy_(self.codec.decode(codes, state)),
                                        "morph: could not capture the live codec's calls (%s); they run op by op "
                                        "for the rest of this batch, slower to the first audio under load. If this "
                                        "repeats, report it")
        if entry is None:
            self._states.clear()
            return None
        entry.keep = (codes, state)
        return entry
