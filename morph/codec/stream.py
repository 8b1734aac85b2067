"""The lean codec's streamer, rows a chunk at a time beside the frame loop, and `decode_whole` for rows already made. A
row's chunks joined are upstream's decode to rounding: an ICL voice's reference is decoded first and cut off, and each
UPSTREAM_CHUNK window after the first starts from a state that has seen only its context, as upstream's chunked_decode.
Nothing here waits for the GPU: the audio is copied to pinned memory and read once its event has passed."""

from __future__ import annotations

import collections
import contextlib
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .calls import LIVE_ROW_FRAMES, call_frames, call_width
from .layers import CodecState, LeanCodec
from .pieces import DECODE_ROW_FRAMES, UPSTREAM_CHUNK, UPSTREAM_CONTEXT, call_rows, pieces, row_frames


class _Row:
    def __init__(self, state: CodecState, ref: torch.Tensor | None):
        self.state: CodecState | None = state
        self.ref = 0 if ref is None else int(ref.shape[0])  # frames of its codes in front of its own
        self.done = 0  # its own frames decoded so far
        self.recent: list[torch.Tensor] = [] if ref is None else [ref]  # its last codes, for a window's context
        self.audio: list[np.ndarray] = []


class CodecStream:
    """Rows decoded a chunk at a time, each opened by name, fed its frames in order and read back with pump()."""

    def __init__(self, codec: LeanCodec, device: torch.device, budget: int = LIVE_ROW_FRAMES, captured: bool = False):
        self.codec, self.device, self.budget = codec, device, budget
        self.stream = codec.side_stream(device)  # None off CUDA: the work runs in line
        self._captured = codec.captured(device) if captured else None
        if captured:
            self._captured.bind()
        self._decode = self._captured.decode if captured else codec.decode
        self.rows: dict = {}  # name -> _Row
        # each feed's audio on its way: (event, host tensor, [(name, _Row, samples, ended)], its device tensor)
        self.flight: collections.deque = collections.deque()

    def _side(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def open(self, name, ref: torch.Tensor | None) -> None:
        """A row starts; ref: its ICL voice's reference codes [frames, 16], or None."""
        frames = 0 if ref is None else int(ref.shape[0])
        with self._side(), torch.inference_mode():
            # from pinned memory: a copy from pageable memory would wait for the device's queue
            here = ref if ref is None or ref.is_cuda or self.stream is None else ref.pin_memory().to(self.device,
                                                                                                   non_blocking=True)
            if frames < UPSTREAM_CHUNK:
                state = CodecState.cat([self.codec.primed(ref, self.device)])  # a copy: the voice's is kept
            else:  # the row starts past upstream's first window: behind that window's context alone
                edge = frames // UPSTREAM_CHUNK * UPSTREAM_CHUNK
                state = self._fresh(here[edge - UPSTREAM_CONTEXT:].to(self.device))[0]
        self.rows[name] = _Row(state, here)

    def warm(self, rows: int, sizes: Sequence[int]) -> None:
        """Make every call shape of up to `rows` rows with chunks of `sizes` frames ready before audio waits for it:
        captured, or else decoded blank so cuDNN plans it. Heaviest first: under the native allocator a capture reuses
        only free blocks no smaller."""
        shapes = [(1 << k, t) for t in sizes  # every power of two up to the widest call
                  for k in range(min(call_width(rows), call_width(call_rows(t, self.budget))).bit_length())]
        with self._side(), torch.inference_mode():
            for width, t in sorted(shapes, key=lambda s: -s[0] * s[1]):
                if self._captured is not None:
                    self._captured.prepare(width, t)
                else:
                    groups = int(self.codec.decoder.config.num_quantizers)
                    self._decode(torch.zeros(width, t, groups, dtype=torch.long, device=self.device),
                                 self._blank(width))

    def done(self, name) -> int:
        return self.rows[name].done

    def feed(self, names: Sequence, frames: Sequence[torch.Tensor], size: int, ended: Sequence[bool]) -> None:
        """frames[i]: the named row's next frames [n_i <= size, 16], copied out on the caller's stream and padded to
        `size`, so the caller may reuse them after; ended[i]: the row has no more."""
        rows, real = [self.rows[name] for name in names], [int(f.shape[0]) for f in frames]
        codes = torch.stack([F.pad(f, (0, 0, 0, size - f.shape[0])) for f in frames]).to(self.device)
        if self.stream is not None:  # read on the codec's stream: it waits for them, and the allocator keeps them
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            codes.record_stream(self.stream)
        with self._side(), torch.inference_mode():
            codes = codes.clamp(0, self.codec.codebook_size - 1)  # a row's frames past its end may hold EOS
            wavs, per_call = [], call_rows(size, self.budget)
            for s in range(0, len(rows), per_call):
                group = rows[s:s + per_call]
                pad = call_width(len(group)) - len(group)
                state = CodecState.cat([r.state for r in group] + ([self._blank(pad)] if pad else []))
                part = codes[s:s + per_call]
                wavs += list(self._decode(F.pad(part, (0, 0, 0, 0, 0, pad)) if pad else part, state))[:len(group)]
                for j, row in enumerate(group):
                    row.state = state.rows(j, j + 1)
            parts = [self._advance(row, codes[i, :real[i]], wavs[i], ended[i]) for i, row in enumerate(rows)]
            flat = torch.cat(parts) if parts else torch.zeros(0, device=self.device)
            host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=self.stream is not None)
            host.copy_(flat, non_blocking=self.stream is not None)
            event = None
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        sizes = [(name, row, int(p.shape[0]), end) for name, row, p, end in zip(names, rows, parts, ended, strict=True)]
        self.flight.append((event, host, sizes, flat))

    def end(self, name) -> None:
        """The row has ended with every frame fed: its whole audio comes with its last chunk."""
        row = self.rows[name]
        row.state = None
        self.flight.append((None, torch.zeros(0), [(name, row, 0, True)], None))

    def drop(self, name) -> None:
        """The row will start again: what it was fed is dropped, chunks in flight included."""
        del self.rows[name]

    def pump(self, flush: bool = False) -> list[tuple[object, np.ndarray, np.ndarray | None]]:
        """(name, float32 24 kHz chunk, whole audio with the last chunk or None) per chunk read back; flush: wait."""
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

    def _advance(self, row: _Row, own: torch.Tensor, wav: torch.Tensor, ended: bool) -> torch.Tensor:
        """The audio of `own` (decoded as `wav`), the row moved past it; from a window's start, that window's decode."""
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
        state = self._blank(1)
        wav = self.codec.decode(codes[None].clamp(0, self.codec.codebook_size - 1), state)
        return state, wav[0]


def decode_whole(codec: LeanCodec, codes: Sequence[torch.Tensor], refs: Sequence[torch.Tensor | None],
                 device: torch.device, budget: int = DECODE_ROW_FRAMES) -> list[np.ndarray]:
    """Rows already made (codes[i] [n_i, 16], refs[i] its ICL reference or None), rows of like length in calls as long
    as call_frames allows (LIVE_CHUNK calls launch far more kernels); a row without frames is silent."""
    audio = [np.zeros(0, np.float32) for _ in codes]
    for group in pieces([c.shape[0] for c in codes], budget):
        longest = max(codes[i].shape[0] for i in group)
        size, rows = call_frames(row_frames(longest)), CodecStream(codec, device, budget)
        for i in group:
            rows.open(i, refs[i])
        for start in range(0, longest, size):
            going = [i for i in group if codes[i].shape[0] > start]
            rows.feed(going, [codes[i][start:start + size] for i in going], size,
                      [codes[i].shape[0] <= start + size for i in going])
        for i, _, whole in rows.pump(flush=True):
            if whole is not None:
                audio[i] = whole
    return audio
