"""Rows already made through the lean codec (morph/codec/layers.py), on the codec's CUDA stream: BatchTTS.decode's
rows, decoded whole, rows of like length together (`decode_whole`). (The continuous batch decodes each row while it is
made: live.py `LiveRows`, whose chunks joined are this decode.)

A row's audio is upstream's decode to rounding, made upstream's way in two respects:
- an ICL voice's reference codes go first and their audio is cut off: decoded once per voice (LeanCodec.primed),
  into the state every row in that voice starts from;
- upstream decodes a row's first UPSTREAM_CHUNK (300) frames in one call, and every later 300 behind only 25
  frames of context (its chunked_decode): the stream covers the first window, and a row longer than that gets the
  rest from upstream's own decoder when it ends (morph/codec/pieces.py tail_audio).

A decode call holds at most `budget` row-frames of activations (a batch's rows go in groups), whatever the batch.
Nothing here waits for the GPU: the work runs on the codec's own stream and audio is copied to pinned memory and
read once its event has passed (side.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from .calls import call_frames
from .layers import CodecState, LeanCodec
from .pieces import DECODE_ROW_FRAMES, UPSTREAM_CHUNK, call_rows, pieces, row_frames, tail_audio
from .side import on_side, take, to_host


class RowsDecode:
    """Rows decoded together from their first frame, in lockstep: frames [done, upto) of every row per call."""

    def __init__(self, codec: LeanCodec, refs: Sequence[torch.Tensor | None], device: torch.device,
                 stream: "torch.cuda.Stream | None", chunk: int, budget: int = DECODE_ROW_FRAMES):
        """chunk: frames of each row a call takes."""
        self.codec, self.stream, self.device = codec, stream, device
        self.chunk = chunk
        self.offsets = [0 if r is None else int(r.shape[0]) for r in refs]  # where each row's own frames start
        self.done = 0
        per_call = call_rows(self.chunk, budget)
        self.groups = [(s, min(s + per_call, len(refs))) for s in range(0, len(refs), per_call)]
        self.waves: dict[tuple[int, int], list[torch.Tensor]] = {g: [] for g in self.groups}
        self.result: tuple | None = None
        with on_side(self.stream), torch.inference_mode():
            self.state = CodecState.cat([codec.primed(r, device) for r in refs])
            self.refs = [None if r is None else r.to(device) for r in refs]  # for the rows past the first window

    @classmethod
    def whole(cls, codec: LeanCodec, codes: Sequence[torch.Tensor], refs: Sequence[torch.Tensor | None],
              device: torch.device, stream: "torch.cuda.Stream | None",
              budget: int = DECODE_ROW_FRAMES) -> "RowsDecode":
        """Rows that have ended, decoded whole (as many at a call as `budget` allows); read with audio().
        A call runs the longest row's frames as call_frames rounds them (CHUNK-frame calls instead launched so many
        kernels that a continuous render ran 5x)."""
        longest = max([row_frames(c.shape[0]) for c in codes] + [1])
        job = cls(codec, refs, device, stream, chunk=call_frames(longest), budget=budget)
        job.finish(codes)
        return job

    def finish(self, codes: Sequence[torch.Tensor]) -> None:
        """codes[i]: row i's frames [n_i, 16], all of them: decode the rest, then start the copy to the host."""
        codes = [c.to(self.device) for c in codes]
        stacked = pad_sequence(codes, batch_first=True)
        # the last chunk padded to a whole one (its padding is cut off): every chunk of a stream has one shape, so
        # cuDNN plans each convolution once, not once more for every batch's last few frames
        stacked = F.pad(stacked, (0, 0, 0, -stacked.shape[1] % self.chunk))
        while stacked.shape[1] > self.done:
            self._decode(stacked[:, self.done:self.done + self.chunk])
        lengths = [int(c.shape[0]) for c in codes]
        up = self.codec.upsample
        take(self.stream, self.device, *codes)
        with on_side(self.stream), torch.inference_mode():
            long = [i for i, n in enumerate(lengths) if self.offsets[i] + n > UPSTREAM_CHUNK]
            full = [codes[i] if self.refs[i] is None else torch.cat((self.refs[i], codes[i])) for i in long]
            tails = dict(zip(long, tail_audio(self.codec.decoder, full), strict=True))
            rows = []
            for start, stop in self.groups:
                streamed = torch.cat(self.waves[(start, stop)], dim=1) if self.waves[(start, stop)] else None
                for i in range(start, stop):
                    own = max(0, min(lengths[i], UPSTREAM_CHUNK - self.offsets[i]))
                    parts = [streamed[i - start, :own * up]] if own else []
                    if i in tails:
                        parts.append(tails[i][max(0, self.offsets[i] - UPSTREAM_CHUNK) * up:])
                    rows.append(torch.cat(parts) if parts else torch.zeros(0, device=self.device))
            event, host, flat = to_host(rows, self.stream, self.device)
        self.waves.clear()
        self.result = (event, host, [r.shape[0] for r in rows], flat)

    def audio(self) -> list[np.ndarray]:
        """Each row's float32 24 kHz audio (waits for the copy)."""
        event, host, sizes, _ = self.result
        if event is not None:
            event.synchronize()
        return [a.numpy().copy() for a in torch.split(host, sizes)]

    def _decode(self, frames: torch.Tensor) -> None:
        """One chunk of every group that still has a row inside upstream's first window."""
        with torch.inference_mode():
            # a row's frames past its end hold EOS (outside the codebooks); their audio is cut off
            codes = frames.clamp(0, self.codec.codebook_size - 1)
        take(self.stream, self.device, codes)
        with on_side(self.stream), torch.inference_mode():
            for start, stop in self.groups:
                if min(self.offsets[start:stop]) + self.done < UPSTREAM_CHUNK:
                    self.waves[(start, stop)].append(self.codec.decode(codes[start:stop],
                                                                       self.state.rows(start, stop)))
        self.done += codes.shape[1]


def decode_whole(codec: LeanCodec, codes: Sequence[torch.Tensor], refs: Sequence[torch.Tensor | None],
                 device: torch.device, stream: "torch.cuda.Stream | None",
                 budget: int = DECODE_ROW_FRAMES) -> list[np.ndarray]:
    """Rows already made (BatchTTS.decode), each decoded whole: rows of like length together (pieces.py pieces), one
    call's audio read back before the next call, so that at most one call's activations are held. A row without
    frames goes with the others' last call, or alone, and is silent."""
    groups = pieces([c.shape[0] for c in codes], budget)
    silent = [i for i, c in enumerate(codes) if not c.shape[0]]
    audio: list[np.ndarray | None] = [None] * len(codes)
    for group in groups + ([silent] if silent else []):
        job = RowsDecode.whole(codec, [codes[i] for i in group], [refs[i] for i in group], device, stream, budget)
        for i, wav in zip(group, job.audio(), strict=True):
            audio[i] = wav
    return audio
