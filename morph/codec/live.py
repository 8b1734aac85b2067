"""Rows decoded while they are made (every row of the continuous batch, streamed or not; which frames go when is
morph/continuous.py's `LiveChunks`): each row a chunk at a time with a codec state of its own, any rows with as many
new frames together in a call, on the codec's stream beside the frame loop (side.py), each call's audio read back
once its copy is done.

A row's chunks joined are its decode whole (stream.py `RowsDecode.whole`, what BatchTTS.decode runs on rows already
made) to rounding, made upstream's way as that is: an ICL voice's reference primes the row's state
(LeanCodec.primed), and from upstream's 300-frame window on, each window starts again behind its 25 frames of
context, as upstream's chunked_decode (pieces.py tail_audio) decodes it.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .calls import LIVE_ROW_FRAMES, call_width
from .layers import CodecState, LeanCodec
from .pieces import UPSTREAM_CHUNK, UPSTREAM_CONTEXT, call_rows
from .side import on_side, take, to_host

class _LiveRow:
    """One row: its state, where it stands and the audio handed back so far."""

    def __init__(self, state: CodecState, ref: torch.Tensor | None):
        self.state: CodecState | None = state
        self.ref = 0 if ref is None else int(ref.shape[0])  # frames of its codes in front of its own
        self.done = 0  # its own frames decoded so far
        self.recent: list[torch.Tensor] = [] if ref is None else [ref]  # its last codes, for a window's context
        self.audio: list[np.ndarray] = []


class LiveRows:
    """Rows decoded while they are made (module docstring), any rows with as many new frames together in a call of at
    most `budget` row-frames; each row is a name, opened, fed its frames in order, and read back with pump()."""

    def __init__(self, codec: LeanCodec, device: torch.device, stream: "torch.cuda.Stream | None",
                 budget: int = LIVE_ROW_FRAMES, captured: bool = False):
        """captured: the calls replay CUDA graphs (LeanCodec.captured), in the fast modes."""
        self.codec, self.device, self.stream, self.budget = codec, device, stream, budget
        self._captured = codec.captured(device) if captured else None
        self._decode = self._captured.decode if captured else codec.decode
        self.rows: dict = {}  # name -> _LiveRow
        # each feed's audio on its way to the host: (event or None, host tensor, [(name, its _LiveRow, samples,
        # ended)], the device tensor it is copied from)
        self.flight: collections.deque = collections.deque()

    def open(self, name, ref: torch.Tensor | None) -> None:
        """A row starts; ref: its ICL voice's reference codes [frames, 16], or None."""
        frames = 0 if ref is None else int(ref.shape[0])
        with on_side(self.stream), torch.inference_mode():
            if frames < UPSTREAM_CHUNK:
                state = CodecState.cat([self.codec.primed(ref, self.device)])  # a copy: the voice's is kept
            else:  # the row starts past upstream's first window: behind that window's context alone
                edge = frames // UPSTREAM_CHUNK * UPSTREAM_CHUNK
                state = self._fresh(ref[edge - UPSTREAM_CONTEXT:].to(self.device))[0]
        self.rows[name] = _LiveRow(state, ref)

    def warm(self, rows: int, sizes: Sequence[int]) -> None:
        """Make ready each call shape a batch of up to `rows` rows makes with chunks of `sizes` frames before the
        first row's audio waits for it: captured, its graph (made once a process: replaying them all at every render
        was a third more GPU time in a lone 1-frame request, bench/results/h200-2026-11-26c); else blank rows
        decoded, so that cuDNN plans it.

        The heaviest shape first: under the native allocator a capture reuses what the graphs' shared pool has
        free only for calls no larger, so captures from the narrowest up left 3.8 GiB in the pool where the widest
        first left 2.8 (32 rows of 16 frames and the narrower, H100, 0.6B dims, bench/results/h100-2026-11-26d)."""
        shapes = [(width, t) for t in sizes
                  for width in _powers_of_two(min(call_width(rows), call_width(call_rows(t, self.budget))))]
        with on_side(self.stream), torch.inference_mode():
            for width, t in sorted(shapes, key=lambda s: -s[0] * s[1]):
                if self._captured is not None:
                    self._captured.prepare(width, t)
                else:
                    groups = int(self.codec.decoder.config.num_quantizers)
                    self._decode(torch.zeros(width, t, groups, dtype=torch.long, device=self.device),
                                 self._blank(width))

    def done(self, name) -> int:
        """The row's own frames decoded so far."""
        return self.rows[name].done

    def feed(self, names: Sequence, codes: torch.Tensor, real: Sequence[int], ended: Sequence[bool]) -> None:
        """codes [rows, T, 16], made on the caller's stream: each named row's next frames, the first real[i] of them
        its own (the rest pads a row's last chunk: its audio is cut off); ended[i]: row i has no more."""
        n, t = codes.shape[:2]
        rows = [self.rows[name] for name in names]
        take(self.stream, self.device, codes)
        with on_side(self.stream), torch.inference_mode():
            codes = codes.clamp(0, self.codec.codebook_size - 1)  # a row's frames past its end may hold EOS
            wavs, per_call = [], call_rows(t, self.budget)
            for s in range(0, n, per_call):
                group = rows[s:s + per_call]
                pad = call_width(len(group)) - len(group)
                state = CodecState.cat([r.state for r in group] + ([self._blank(pad)] if pad else []))
                part = codes[s:s + per_call]
                wavs += list(self._decode(F.pad(part, (0, 0, 0, 0, 0, pad)) if pad else part, state))[:len(group)]
                for j, row in enumerate(group):
                    row.state = state.rows(j, j + 1)
            parts = [self._advance(row, codes[i, :real[i]], wavs[i], ended[i]) for i, row in enumerate(rows)]
            event, host, flat = to_host(parts, self.stream, self.device)
        sizes = [(name, row, int(p.shape[0]), end) for name, row, p, end in zip(names, rows, parts, ended, strict=True)]
        self.flight.append((event, host, sizes, flat))

    def end(self, name) -> None:
        """The row has ended with every frame fed: its whole audio comes after its last chunk."""
        row = self.rows[name]
        row.state = None
        self.flight.append((None, torch.zeros(0), [(name, row, 0, True)], None))

    def drop(self, name) -> None:
        """The row will start again (a preempted one): what it was fed is dropped, its chunks still in flight
        included, and it may be opened again."""
        del self.rows[name]

    def pump(self, flush: bool = False) -> list[tuple[object, np.ndarray, np.ndarray | None]]:
        """(name, float32 24 kHz chunk, the row's whole audio after its last chunk, else None) for every chunk read
        back, each row's in order; flush: wait for all of them."""
        out = []
        while self.flight and (flush or self.flight[0][0] is None or self.flight[0][0].query()):
            event, host, sizes, _ = self.flight.popleft()
            if event is not None:
                event.synchronize()
            for (name, row, _, end), part in zip(sizes, torch.split(host, [s for _, _, s, _ in sizes]), strict=True):
                if self.rows.get(name) is not row:  # dropped (and maybe opened again) after this chunk was fed
                    continue
                row.audio.append(part.numpy().copy())
                out.append((name, row.audio[-1], np.concatenate(row.audio) if end else None))
                if end:
                    del self.rows[name]
        return out

    def _advance(self, row: _LiveRow, own: torch.Tensor, wav: torch.Tensor, ended: bool) -> torch.Tensor:
        """The audio of `own` (row's next frames, already decoded as `wav` from its state), and the row moved past
        them. A chunk that reaches upstream's next window: its frames from there, and the row's state, are the window's
        own decode behind its context."""
        up, n = self.codec.upsample, int(own.shape[0])
        start, stop = row.ref + row.done, row.ref + row.done + n  # in the codes with the reference in front
        row.done += n
        row.recent.append(own)
        edge = stop // UPSTREAM_CHUNK * UPSTREAM_CHUNK  # the last window start at or before `stop`
        audio = wav[:(edge - start if edge > start else n) * up]
        if edge > start and (stop > edge or not ended):
            context = torch.cat([c.to(self.device) for c in row.recent])[-(stop - edge + UPSTREAM_CONTEXT):]
            row.state, tail = self._fresh(context)
            audio = torch.cat((audio, tail[UPSTREAM_CONTEXT * up:]))
        while len(row.recent) > 1 and sum(c.shape[0] for c in row.recent[1:]) >= UPSTREAM_CONTEXT:
            row.recent.pop(0)
        if ended:
            row.state, row.recent = None, []
        return audio

    def _blank(self, rows: int) -> CodecState:
        """Rows that pad a call to its width: decoded, their audio and state dropped."""
        return self.codec.zero_state(rows, self.device, next(self.codec.decoder.parameters()).dtype)

    def _fresh(self, codes: torch.Tensor) -> tuple[CodecState, torch.Tensor]:
        """A state that has seen only `codes` [frames, 16] (upstream's zero padding before them), and their audio."""
        state = self.codec.zero_state(1, self.device, next(self.codec.decoder.parameters()).dtype)
        wav = self.codec.decode(codes[None].clamp(0, self.codec.codebook_size - 1), state)
        return state, wav[0]


def _powers_of_two(top: int) -> list[int]:
    """1, 2, 4, ... up to `top` (a power of two)."""
    return [1 << k for k in range(top.bit_length())]
