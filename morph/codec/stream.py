"""A render's rows through the lean codec (morph/codec/layers.py), on a CUDA stream of its own beside the frame loop.

- A static batch (what BatchTTS.render runs by default) decodes its rows together, chunk_for(rows) frames at a time
  (16 for 8 rows and up, 128 for one) as the talker makes them (`RowsDecode.feed`, called from the frame loop), so
  when the batch's last row ends only its last chunk is left: the codec is off the critical path.
- The continuous batch decodes rows whole, together with those that ended about as they did (`CodecStream`), or,
  when the render streams its audio, each row while it is made, a chunk at a time with a state of its own, any rows
  together in a call (`LiveRows`; which frames go when is morph/continuous.py's `LiveChunks`).

Either way a row's audio is upstream's decode to rounding, made upstream's way in two respects:
- an ICL voice's reference codes go first and their audio is cut off: decoded once per voice (LeanCodec.primed),
  into the state every row in that voice starts from;
- upstream decodes a row's first UPSTREAM_CHUNK (300) frames in one call, and every later 300 behind only 25
  frames of context (its chunked_decode): the stream covers the first window, and a row longer than that gets the
  rest from upstream's own decoder when it ends (morph/codec/pieces.py tail_audio); a streamed row starts each
  later window again on the lean codec, behind the same 25 frames.

A decode call holds at most `budget` row-frames of activations (a batch's rows go in groups), whatever the batch.
Nothing here waits for the GPU: audio is copied to pinned memory and read once its event has passed.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from .layers import CHUNK, CodecState, LeanCodec, call_frames, chunk_for
from .pieces import DECODE_ROW_FRAMES, UPSTREAM_CHUNK, UPSTREAM_CONTEXT, pieces, row_frames, tail_audio

IN_FLIGHT = 2  # continuous batch: groups launched and not yet read back
# A streamed row (LiveRows). The codec looks at no frame ahead (every layer is causal, morph/codec/layers.py), so a
# row's audio up to a frame can be decoded as soon as the frame is made, in chunks of any size, the same to rounding.
# What sizes a chunk is the cost of a call: about 1,400 kernel launches whatever it holds, on the frame loop's host
# thread. So a row's first chunk comes at the first FIRST_GRID-frame mark after its first frame (1 to 4 frames), its
# next ones every FIRST_GRID frames until it is in step with the LIVE_CHUNK-frame marks, and from there LIVE_CHUNK
# frames at a time (CHUNK: 1.28 s of audio, the static batch's call), every live row in the same few calls.
FIRST_GRID = 4
LIVE_CHUNK = CHUNK


def call_rows(chunk: int, budget: int = DECODE_ROW_FRAMES) -> int:
    """Rows one decode call takes when each brings `chunk` frames: as many as `budget` row-frames allow, at least
    one (morph/memory.py declares such a call)."""
    return max(1, budget // chunk)


def _side(stream: "torch.cuda.Stream | None"):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _take(stream: "torch.cuda.Stream | None", device, *tensors: torch.Tensor) -> None:
    """Tensors made on the caller's (the frame loop's) stream, read on the codec's: it waits for them, and the
    allocator keeps them until it has."""
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(device))
        for t in tensors:
            t.record_stream(stream)


def _to_host(pieces: list[torch.Tensor], stream: "torch.cuda.Stream | None", device) -> tuple:
    """Start the copy of `pieces`, joined, to the host (on the codec's stream): (event or None, host tensor, the
    joined tensor on the device, kept with them until the copy is read)."""
    flat = torch.cat(pieces) if pieces else torch.zeros(0, device=device)
    host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=stream is not None)
    host.copy_(flat, non_blocking=stream is not None)
    event = None
    if stream is not None:
        event = torch.cuda.Event()
        event.record(stream)
    return event, host, flat


class RowsDecode:
    """Rows decoded together from their first frame, in lockstep: frames [done, upto) of every row per call."""

    def __init__(self, codec: LeanCodec, refs: Sequence[torch.Tensor | None], device: torch.device,
                 stream: "torch.cuda.Stream | None", chunk: int | None = None, budget: int = DECODE_ROW_FRAMES):
        """chunk: frames of each row a call takes (default chunk_for(rows))."""
        self.codec, self.stream, self.device = codec, stream, device
        self.chunk = chunk_for(len(refs)) if chunk is None else chunk
        self.offsets = [0 if r is None else int(r.shape[0]) for r in refs]  # where each row's own frames start
        self.done = 0
        per_call = call_rows(self.chunk, budget)
        self.groups = [(s, min(s + per_call, len(refs))) for s in range(0, len(refs), per_call)]
        self.waves: dict[tuple[int, int], list[torch.Tensor]] = {g: [] for g in self.groups}
        self.result: tuple | None = None
        with _side(self.stream), torch.inference_mode():
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

    def feed(self, frames: torch.Tensor, upto: int) -> None:
        """frames [rows, >= upto, 16] on the device (the frame loop's buffer): decode the whole chunks of
        frames done .. upto not yet decoded."""
        while upto - self.done >= self.chunk:
            self._decode(frames[:, self.done:self.done + self.chunk])

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
        _take(self.stream, self.device, *codes)
        with _side(self.stream), torch.inference_mode():
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
            event, host, flat = _to_host(rows, self.stream, self.device)
        self.waves.clear()
        self.result = (event, host, [r.shape[0] for r in rows], flat)

    def fence(self) -> None:
        """The caller's stream waits for this decode before its next work (the GPU waits, not the host)."""
        if self.result[0] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.result[0])

    def ready(self) -> bool:
        return self.result[0] is None or self.result[0].query()

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
        _take(self.stream, self.device, codes)
        with _side(self.stream), torch.inference_mode():
            for start, stop in self.groups:
                if min(self.offsets[start:stop]) + self.done < UPSTREAM_CHUNK:
                    self.waves[(start, stop)].append(self.codec.decode(codes[start:stop],
                                                                       self.state.rows(start, stop)))
        self.done += codes.shape[1]


class CodecStream:
    """The continuous batch's ended rows: decoded whole, in groups of like length (at most `budget` row-frames),
    IN_FLIGHT groups at a time, read back once done."""

    def __init__(self, codec: LeanCodec, device: torch.device, stream: "torch.cuda.Stream | None",
                 budget: int = DECODE_ROW_FRAMES):
        self.codec, self.device, self.stream, self.budget = codec, device, stream, budget
        self.waiting: list[tuple] = []  # (name, codes [frames, 16], reference codes or None)
        self.flight: collections.deque = collections.deque()  # (names, RowsDecode)

    def submit(self, name, codes: torch.Tensor, ref: torch.Tensor | None) -> None:
        self.waiting.append((name, codes, ref))

    def pump(self, flush: bool = False) -> list[tuple[object, np.ndarray]]:
        """The rows whose audio is ready, as (name, float32 24 kHz audio); launches the next group when fewer than
        IN_FLIGHT are under way. flush: launch and read back everything (the render's end)."""
        done = []
        while self.flight and (flush or self.flight[0][1].ready()):
            names, job = self.flight.popleft()
            done += list(zip(names, job.audio(), strict=True))
        while self.waiting and (flush or len(self.flight) < IN_FLIGHT):
            self._launch()
            if flush:
                done += self.pump(flush=True)
        return done

    def _launch(self) -> None:
        lengths = [w[1].shape[0] for w in self.waiting]
        # rows without frames are in no piece: they go together once the others are launched
        group = next(iter(pieces(lengths, self.budget)), None) or list(range(len(self.waiting)))
        rows = [self.waiting[i] for i in group]
        self.waiting = [w for i, w in enumerate(self.waiting) if i not in set(group)]
        job = RowsDecode.whole(self.codec, [w[1] for w in rows], [w[2] for w in rows], self.device, self.stream,
                               self.budget)
        self.flight.append(([w[0] for w in rows], job))


class _LiveRow:
    """One streamed row: its state, where it stands and the audio handed back so far."""

    def __init__(self, state: CodecState, ref: torch.Tensor | None):
        self.state: CodecState | None = state
        self.ref = 0 if ref is None else int(ref.shape[0])  # frames of its codes in front of its own
        self.done = 0  # its own frames decoded so far
        self.recent: list[torch.Tensor] = [] if ref is None else [ref]  # its last codes, for a window's context
        self.audio: list[np.ndarray] = []


class LiveRows:
    """Rows decoded while they are made (the continuous batch's, when a render streams): each row with a state of its
    own, any rows with as many new frames together in a call (at most `budget` row-frames), each call's audio read
    back once done. A row's chunks joined are its decode whole (RowsDecode.whole) to rounding: an ICL reference
    primes its state, and from upstream's 300-frame window on, each window starts again behind its 25 frames of
    context, as upstream's chunked_decode (morph/codec/pieces.py tail_audio) decodes it."""

    def __init__(self, codec: LeanCodec, device: torch.device, stream: "torch.cuda.Stream | None",
                 budget: int = DECODE_ROW_FRAMES):
        self.codec, self.device, self.stream, self.budget = codec, device, stream, budget
        self.rows: dict = {}  # name -> _LiveRow
        # each feed's audio on its way to the host: (event or None, host tensor, [(name, samples, ended)], the
        # device tensor it is copied from)
        self.flight: collections.deque = collections.deque()

    def open(self, name, ref: torch.Tensor | None) -> None:
        """A row starts; ref: its ICL voice's reference codes [frames, 16], or None."""
        frames = 0 if ref is None else int(ref.shape[0])
        with _side(self.stream), torch.inference_mode():
            if frames < UPSTREAM_CHUNK:
                state = CodecState.cat([self.codec.primed(ref, self.device)])  # a copy: the voice's is kept
            else:  # the row starts past upstream's first window: behind that window's context alone
                edge = frames // UPSTREAM_CHUNK * UPSTREAM_CHUNK
                state = self._fresh(ref[edge - UPSTREAM_CONTEXT:].to(self.device))[0]
        self.rows[name] = _LiveRow(state, ref)

    def done(self, name) -> int:
        """The row's own frames decoded so far."""
        return self.rows[name].done

    def feed(self, names: Sequence, codes: torch.Tensor, real: Sequence[int] | None = None,
             ended: Sequence[bool] | None = None) -> None:
        """codes [rows, T, 16], made on the caller's stream: each named row's next frames, all T of them or the first
        real[i] (the rest pads a row's last chunk: its audio is cut off); ended[i]: row i has no more."""
        n, t = codes.shape[:2]
        real = [t] * n if real is None else list(real)
        ended = [False] * n if ended is None else list(ended)
        rows = [self.rows[name] for name in names]
        _take(self.stream, self.device, codes)
        with _side(self.stream), torch.inference_mode():
            codes = codes.clamp(0, self.codec.codebook_size - 1)  # a row's frames past its end may hold EOS
            wavs, per_call = [], call_rows(t, self.budget)
            for s in range(0, n, per_call):
                group = rows[s:s + per_call]
                state = CodecState.cat([r.state for r in group])
                wavs += list(self.codec.decode(codes[s:s + per_call], state))
                for j, row in enumerate(group):
                    row.state = state.rows(j, j + 1)
            pieces = [self._advance(row, codes[i, :real[i]], wavs[i], ended[i]) for i, row in enumerate(rows)]
            event, host, flat = _to_host(pieces, self.stream, self.device)
        sizes = [(name, int(p.shape[0]), end) for name, p, end in zip(names, pieces, ended, strict=True)]
        self.flight.append((event, host, sizes, flat))

    def end(self, name) -> None:
        """The row has ended with every frame fed: its whole audio comes after its last chunk."""
        self.rows[name].state = None
        self.flight.append((None, torch.zeros(0), [(name, 0, True)], None))

    def pump(self, flush: bool = False) -> list[tuple[object, np.ndarray, np.ndarray | None]]:
        """(name, float32 24 kHz chunk, the row's whole audio after its last chunk, else None) for every chunk read
        back, each row's in order; flush: wait for all of them."""
        out = []
        while self.flight and (flush or self.flight[0][0] is None or self.flight[0][0].query()):
            event, host, sizes, _ = self.flight.popleft()
            if event is not None:
                event.synchronize()
            for (name, _, end), part in zip(sizes, torch.split(host, [s for _, s, _ in sizes]), strict=True):
                row = self.rows[name]
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

    def _fresh(self, codes: torch.Tensor) -> tuple[CodecState, torch.Tensor]:
        """A state that has seen only `codes` [frames, 16] (upstream's zero padding before them), and their audio."""
        state = self.codec.zero_state(1, self.device, next(self.codec.decoder.parameters()).dtype)
        wav = self.codec.decode(codes[None].clamp(0, self.codec.codebook_size - 1), state)
        return state, wav[0]
