"""The codec off the critical path: rows that have ended are decoded to audio on a CUDA stream of their own,
launched from the frame loop between two frames, while the batch goes on (morph/decode/slots.py).

The frame loop is launch-bound (one CUDA graph a frame, small kernels), so the codec's wide convolutions fill the
GPU beside it. Launching a piece costs the host a few ms, less than the frames the loop keeps queued; nothing
here waits for the GPU until the end of the render: a piece's audio is copied to pinned memory and read once its
event has passed. (A worker thread was measured first: its launches held the GIL against the frame loop, and end
to end fell to a quarter of the decode alone; bench/results/h100-2026-11-24/NOTES.md.)

A piece is upstream's decode (Qwen3TTSTokenizerV2Model.decode) without its host syncs: rows padded with -1 then
clamped, the decoder's chunked_decode, each row cut to its frames; so a row's audio is what morph/codec.py's
decode_rows gives for the same piece, and its decode alone to rounding. Pieces as morph/codec.py forms them.
"""

from __future__ import annotations

import collections

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from .codec import DECODE_ROW_FRAMES, pieces

IN_FLIGHT = 2  # pieces launched and not yet read back: bounds the codec's memory


class CodecStream:
    def __init__(self, tokenizer, stream: "torch.cuda.Stream | None"):
        """tokenizer: qwen-tts's 12 Hz speech tokenizer; stream: the CUDA stream to decode on (None on the CPU)."""
        self.model, self.stream = tokenizer.model, stream
        self.upsample = int(tokenizer.model.decode_upsample_rate)
        self.waiting: list[tuple] = []  # (name, codes with any reference in front, reference frames, event)
        self.flight: collections.deque = collections.deque()  # (event, host audio, rows, device tensors kept)

    def submit(self, name, codes: torch.Tensor, ref: torch.Tensor | None) -> None:
        """Queue `codes` [frames, 16], made on the caller's current stream, with an ICL voice's reference codes."""
        full = codes if ref is None else torch.cat([ref.to(codes.device), codes])
        event = None
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record()
        self.waiting.append((name, full, 0 if ref is None else int(ref.shape[0]), event))

    def pump(self, flush: bool = False) -> list[tuple[object, np.ndarray]]:
        """The rows whose audio is ready, as (name, float32 24 kHz audio); launches the next piece when fewer than
        IN_FLIGHT are under way. flush: launch and read back everything (the render's end)."""
        done = []
        while self.flight and (flush or self.flight[0][0] is None or self.flight[0][0].query()):
            event, host, rows, _ = self.flight.popleft()
            if event is not None:
                event.synchronize()
            done += [(name, host[i, cut:length].numpy().copy()) for i, (name, cut, length) in enumerate(rows)]
        while self.waiting and (flush or len(self.flight) < IN_FLIGHT):
            self._launch()
            if flush:
                done += self.pump(flush=True)
        return done

    def _launch(self) -> None:
        """The first piece of the rows waiting, on the codec's stream."""
        empty = [w for w in self.waiting if w[1].shape[0] == w[2]]  # no frames of its own: silent
        self.waiting = [w for w in self.waiting if w[1].shape[0] > w[2]]
        if empty:
            self.flight.append((None, torch.zeros(len(empty), 0), [(w[0], 0, 0) for w in empty], None))
        if not self.waiting:
            return
        piece = pieces([w[1].shape[0] for w in self.waiting], DECODE_ROW_FRAMES)[0]
        rows = [self.waiting[i] for i in piece]
        self.waiting = [w for i, w in enumerate(self.waiting) if i not in set(piece)]
        context = torch.cuda.stream(self.stream) if self.stream is not None else torch.inference_mode()
        with context, torch.inference_mode():
            for *_, event in rows:
                if event is not None:
                    self.stream.wait_event(event)
            codes = pad_sequence([w[1] for w in rows], batch_first=True, padding_value=-1).clamp(min=0)
            wav = self.model.decoder.chunked_decode(codes.transpose(1, 2)).squeeze(1).to(torch.float32)
            host = torch.empty(wav.shape, dtype=torch.float32, pin_memory=self.stream is not None)
            host.copy_(wav, non_blocking=self.stream is not None)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        spans = []
        for name, full, ref, _ in rows:
            length = full.shape[0] * self.upsample
            # as morph/codec.py cuts an ICL voice's reference audio
            spans.append((name, int(ref / full.shape[0] * length), length))
        self.flight.append((event, host, spans, (codes, wav, [w[1] for w in rows])))
