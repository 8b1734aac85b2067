"""The engine's runner: rows through one continuous batch, each row's audio decoded while it is made (`LiveChunks`)
and handed out as chunks and whole, the next group's prompt built ahead on a worker thread (`GroupAhead`), and a
live request's built as it is submitted (`prompts_aside`)."""

from __future__ import annotations

import collections
import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterable, TypeVar

import numpy as np
import torch

from ..codec.calls import FIRST_GRID, LAST_CHUNK, LIVE_CHUNK, RAMP_SIZES, call_frames, live_row_frames, ramp_size
from ..codec.stream import CodecStream
from ..graphs import CAPTURE_LOCK, PROMPTS, frame_loop_stream, side_stream
from ..lines.line import Line, Row
from ..lines.reference_audio import MAX_SECONDS, MAX_TRANSCRIPT_CHARS_PER_SECOND
from ..lines.text_split import MAX_SEGMENT_CHARS
from ..lines.voice import Voice
from ..prompts import batch_inputs, left_pads, prompt_inputs, row_prompts
from ..settings import FRAMES_PER_SECOND, GenerationSettings

if TYPE_CHECKING:
    from ..decode.groups import Group
    from .scheduler import Pace

T = TypeVar("T")
_PROMPT = ("inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed")

# The engine's short run before the first request (MorphTTS.ready), WARM_FRAMES frames a row: WARM_LONG's frame limit
# sizes the pool for a script's lines, shorter texts meet shorter prefills, and longest_line sizes the state.
WARM_LONG = ("We leave at dawn, before the fog lifts from the river, and we do not stop until we reach the old stone "
             "bridge. If the guards ask, we are traders from the coast, carrying salt and dried fish for the winter "
             "market, and we have papers to prove it. Keep your hood up and let me do the talking.")
WARM_SHORT = ("Ready.", "Are you ready to go?", "The lanterns are lit, and the road ahead is quiet tonight.")
WARM_FRAMES = 40


class RowRunner:
    """One continuous batch, kept between runs while the settings hold: each row's audio to on_chunk as it comes and to
    on_row whole as it ends. need, prompt: the most cache slots and prompt tokens a row may take (every row must fit);
    pages, overcommit: as ContinuousBatch's; pace: a live batch's (rows join at any frame, chunks ramp up)."""

    def __init__(self, tts, settings: GenerationSettings, width: int, need: int, prompt: int,
                 stop: Callable[[Row], int], on_row: Callable[[Row, object], None], audio: bool = True,
                 on_chunk: Callable[[Row, np.ndarray], None] | None = None, pages: int | None = None,
                 overcommit: bool = False, pace: Pace | None = None):
        self.tts, self.settings, self.width, self.stop = tts, settings, width, stop
        self.need, self.prompt, self.pace = need, prompt, pace
        self.on_row, self.audio, self.on_chunk, self.pages, self.overcommit = on_row, audio, on_chunk, pages, overcommit
        self.batch = None  # built for the first group: its options come with that group's prompt
        self._ended = self._hand = self._live = None
        self._queued: list[Group] = []  # the group the batch was built for, before it joins
        self._ahead: GroupAhead | None = None  # the run's groups built ahead

    def step(self, take: Callable[[int], list[tuple[Row, int]]], before_frame: Callable[[int], None] | None = None,
             put_back: Callable[[tuple[Row, int]], None] | None = None, ahead: bool = False) -> bool:
        """One frame of the batch; False once every row has ended and take(n) (up to n (row, stream key), [] when none
        waits) has none, the run's rows handed over. put_back: a preempted row, for take to give again; ahead: build
        each group's prompt while the one before joins. A caller that stops mid-run calls close()."""
        if self.batch is None:
            chunk = take(self.width)
            if not chunk:
                return False
            options, first = self._group(chunk)
            self._build(options)
            self._queued.append(first)
        if ahead and self._ahead is None:  # once the batch is built: its captures need not wait for the worker
            self._ahead = GroupAhead(lambda chunk: self._group(chunk)[1], take, self.width, self.tts.device)

        def next_group(n: int) -> "Group | None":
            if self._queued:
                return self._queued.pop()
            if self._ahead is not None:
                return self._ahead.next()
            return self._group(chunk)[1] if (chunk := take(n)) else None

        def preempted(row: Row, key: int) -> None:
            if self._live is not None:
                self._live.drop(row)
            put_back((row, key))

        def frame(n: int) -> None:
            self._hand()
            if before_frame is not None:
                before_frame(n)

        try:
            stepped = self.batch.step(next_group, self._ended if self.audio else self.on_row,
                                      frame if self.audio else before_frame, preempted)
        except BaseException:
            self.close()
            raise
        if not stepped:
            self.close()
        return stepped

    def close(self) -> None:
        """End the run: a group being built ahead is dropped, and rows that ended before a failure, a cancel or the
        caller's stop are still decoded and handed over."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        if self._hand is not None:
            self._hand(flush=True)

    def cancel(self, rows) -> None:
        """End these rows at the next frame (on the batch's thread)."""
        if self.batch is not None:
            self.batch.cancel(rows)

    def _group(self, chunk: list[tuple[Row, int]]) -> tuple[dict, "Group"]:
        """Rows to join together, their prompt as upstream's generate builds it, and the talker's sampling options."""
        from ..decode.groups import Group  # the decode path loads with a model, not with the nodes

        model = self.tts.tts
        rows = [r for r, _ in chunk]
        longest = max(rows, key=lambda r: r.limit)
        options = dict(min_new_tokens=self.settings.min_new_tokens,
                       **model._merge_generate_kwargs(**self.settings.upstream_kwargs(longest.text)))
        if all(r.prompt is not None for r in rows):  # built when they were submitted (prompts_aside)
            prompts = [r.prompt for r in rows]
            for p in (p for p in prompts if p.done is not None):
                waited_for(p.done, (p.embeds, p.trailing, p.pad), p.embeds.device)
        else:
            prompts = row_prompts(model.model, [r.line.language for r in rows], **prompt_inputs(self.tts, rows))
        got = batch_inputs(model.model, prompts, **options)
        return got, Group(rows, {k: got[k] for k in _PROMPT}, [self.stop(r) for r in rows], [k for _, k in chunk],
                          left_pads(prompts))

    def _build(self, options: dict) -> None:
        from .batch import ContinuousBatch

        tts = self.tts
        # a render's rows join at FIRST_GRID marks, so first chunks share one codec call shape (a live batch's join at
        # any frame and ramp up)
        grid = FIRST_GRID if self.audio and self.pace is None else 1
        self.batch = ContinuousBatch(tts.patch.loop, self.width, self.need, self.prompt, options,
                                     self.settings.seq_groups, tts.patch.mode, tts.device, tts.tts.model.dtype,
                                     self.pages, self.overcommit, self.pace, grid)
        if not self.audio:
            return
        from ..decode.runner import FAST_MODES

        # every row is decoded while it is made, streamed or not: its calls replay graphs, where a whole row at its
        # end would launch every kernel from this thread (bench/results/h100-2026-11-25e/NOTES.md)
        codec = CodecStream(tts.codec, tts.device, live_row_frames(self.width), self.batch.mode in FAST_MODES)
        live = self._live = LiveChunks(self.batch, codec, ramp=self.pace is not None)
        if tts.device.type == "cuda":  # cuDNN plans each call shape on its first use
            live.codec.warm(self.width, live.sizes)
        self._ended = live.end
        # the hand-over holds what it calls, not the runner: a runner that referred to itself would keep the batch's
        # state alive after release_device_state, until the garbage collector ran
        on_row, on_chunk = self.on_row, self.on_chunk

        def hand(flush: bool = False) -> None:
            if flush:
                live.finish()
            else:
                live.step()
            for row, wav, whole in live.codec.pump(flush=flush):
                if wav.size and on_chunk is not None:
                    on_chunk(row, wav)
                if whole is not None:
                    on_row(row, whole)
        self._hand = hand


class GroupAhead:
    """Groups of up to `width` rows from take(n), each built by build(chunk) on a worker thread while the caller runs
    the one before, as prompts would stall the frame loop (bench/results/h100-2026-11-26f/NOTES.md)."""

    def __init__(self, build: Callable[[list], "Group"], take: Callable[[int], list], width: int,
                 device: torch.device):
        self.build, self.take, self.width, self.device = build, take, width, device
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="morph-prompts")
        self._next: Future | None = None
        self.start()

    def start(self) -> None:
        chunk = self.take(self.width)
        if not chunk:
            self._next = None
            return
        after = None
        if self.device.type == "cuda":  # the caller's work so far, which the worker's stream waits for
            after = torch.cuda.current_stream(self.device).record_event()
        self._next = self._worker.submit(self._build, chunk, after)

    def next(self) -> "Group | None":
        """The group built ahead, ready for the caller's stream, the next one started; None when no row is left."""
        if self._next is None:
            self.start()
            if self._next is None:
                return None
        group, done = self._next.result()
        if done is not None:
            waited_for(done, group.prompt.values(), self.device)
        self.start()
        return group

    def close(self) -> None:
        """Wait for a group being built and stop the worker; its rows are dropped."""
        self._worker.shutdown(wait=True)
        self._next = None

    def _build(self, chunk: list, after: "torch.cuda.Event | None") -> tuple["Group", "torch.cuda.Event | None"]:
        return built_aside(self.device, lambda: self.build(chunk), after)


def built_aside(device: torch.device, build: Callable[[], T], after: "torch.cuda.Event | None" = None
                ) -> tuple[T, "torch.cuda.Event | None"]:
    """build() on a thread beside the engine's, in inference mode, on the prompts' side stream once `after` (the
    engine's work so far) is done: what it built, and the event the engine's stream waits for (None on the CPU)."""
    with torch.inference_mode():
        if device.type != "cuda":
            return build(), None
        stream = side_stream(device, PROMPTS)
        with CAPTURE_LOCK, torch.cuda.device(device), torch.cuda.stream(stream):
            if after is not None:
                stream.wait_event(after)
            out = build()
            done = stream.record_event()
        return out, done


def prompts_aside(tts, rows: list[Row], tokenize: Callable[[list[str]], list[torch.Tensor]]) -> list[Row]:
    """The rows, each with its talker prompt built now, on this thread (beside the engine's: tokenize is
    a prompts.PrivateTokenizer's), so that their join costs the engine's loop only the batching."""
    languages = [r.line.language for r in rows]
    prompts, done = built_aside(tts.device, lambda: row_prompts(tts.tts.model, languages,
                                                                **prompt_inputs(tts, rows, tokenize)))
    return [dataclasses.replace(r, prompt=dataclasses.replace(p, done=done))
            for r, p in zip(rows, prompts, strict=True)]


def waited_for(done: "torch.cuda.Event", tensors: Iterable[torch.Tensor], device: torch.device) -> None:
    """For this thread, what built_aside made: its stream waits for `done`, and the tensors are marked as used on it."""
    stream = torch.cuda.current_stream(device)
    stream.wait_event(done)
    for t in tensors:
        t.record_stream(stream)


def warm_lines(tts, n: int) -> list[Line]:
    """n lines for the engine's short run: blank x-vector and ICL voices (Base), a speaker, or an instruct."""
    texts = [WARM_SHORT[i // 4 % len(WARM_SHORT)] if i % 4 == 3 else WARM_LONG for i in range(n)]
    if tts.variant == "base":
        blank = torch.zeros(tts.hidden_size)
        voices = [Voice(blank, None, None, tts.model_size),
                  Voice(blank, torch.zeros(WARM_FRAMES, 16, dtype=torch.long), "Ready when you are.", tts.model_size)]
        return [Line(t, voices[i % 2]) for i, t in enumerate(texts)]
    extra = dict(speaker=tts.speakers[0]) if tts.variant == "custom_voice" else dict(instruct="A calm, clear voice.")
    return [Line(t, **extra) for t in texts]


def longest_line(tts) -> Line:
    """The row with the most cache slots and prompt tokens a script holds, for the engine's short run to size the
    state it keeps: a segment of MAX_SEGMENT_CHARS digits (a token each, as many as any text's characters make), for
    Base in an ICL voice of the longest reference and transcript make_voice takes without a warning."""
    def digits(n: int) -> str:
        return ("0123456789" * n)[:n]

    text = digits(MAX_SEGMENT_CHARS)
    if tts.variant != "base":  # a speaker's or an instruct's
        return dataclasses.replace(warm_lines(tts, 1)[0], text=text)
    frames = int(MAX_SECONDS * FRAMES_PER_SECOND)
    transcript = digits(int(MAX_SECONDS * MAX_TRANSCRIPT_CHARS_PER_SECOND))
    voice = Voice(torch.zeros(tts.hidden_size), torch.zeros(frames, 16, dtype=torch.long), transcript, tts.model_size)
    return Line(text, voice)


def ready_lines(tts, width: int) -> list[Line]:
    """MorphTTS.ready's render of `width` rows: the short run's lines and the longest row."""
    return warm_lines(tts, width - 1) + [longest_line(tts)]


def warm_prefills(tts, shapes: list[tuple[int, int]]) -> None:
    """(on the thread that owns the model) Capture the prefill buckets `shapes` (rows, tokens), as a join would."""
    loop = tts.patch.loop
    with torch.inference_mode(), frame_loop_stream(tts.device):
        loop.prefills.warm(loop, shapes, tts.tts.model.dtype)


def budget_pages(tts, kv_cache_bytes: int | None) -> int | None:
    """The pages a pool of `kv_cache_bytes` holds on this model (None: the dense cache)."""
    if kv_cache_bytes is None:
        return None
    from ..decode.kv_store import pages_for_bytes  # the decode path loads with a model, not with the nodes

    return pages_for_bytes(tts.patch.loop, tts.tts.model.dtype, kv_cache_bytes)


class LiveChunks:
    """Which frames of the batch's rows go to the codec before each frame, so a row's audio comes while it is made in
    as few calls as that takes (codec/calls.py says why these sizes); only frames `batch.lag` behind are known to be a
    row's own. With `ramp` (a live batch's), each row's chunks grow from FIRST_CHUNK to LIVE_CHUNK on marks of their
    size, and the smallest calls go first, so a first chunk waits behind no longer one."""

    def __init__(self, batch, codec: CodecStream, ramp: bool = False):
        self.batch, self.codec, self.ramp = batch, codec, ramp
        # the chunks' call sizes, and an ended row's rest's
        self.sizes = (RAMP_SIZES if ramp else (FIRST_GRID, LIVE_CHUNK)) + (LAST_CHUNK,)
        self.lag = batch.lag
        self.joined: dict[Row, int] = {}  # row -> the frame it joined before
        self.ended: list[tuple[Row, torch.Tensor]] = []  # rows that ended since the last mark, with their codes

    def end(self, row: Row, codes: torch.Tensor) -> None:
        """The batch's `finished`: the row ended with `codes` [frames, 16]."""
        del self.joined[row]
        self.ended.append((row, codes))

    def drop(self, row: Row) -> None:
        """The batch preempted the row: its frames so far are dropped (none has gone out)."""
        if row in self.joined:  # else preempted before the frame it joined at: nothing of it was opened
            del self.joined[row]
            self.codec.drop(row)

    def step(self) -> None:
        """Before each frame: joined rows open, and the chunks now due go to the codec."""
        run = self.batch.sched.frame  # rows join on the scheduler's grid: a render's at FIRST_GRID marks
        for live in self.batch.live.values():
            if live.name not in self.joined:
                self.joined[live.name] = run
                self.codec.open(live.name, None if live.name.line.voice is None else live.name.line.voice.ref_code)
        known = run - self.lag  # the batch's frames known to be the rows' own
        if not self.ramp and (known <= 0 or known % FIRST_GRID):
            return
        due = self._rests()
        for slot, live in self.batch.live.items():
            row, done, at = live.name, self.codec.done(live.name), self.joined[live.name]
            if self.ramp:
                n = ramp_size(at + done, done)
                # a row's first frames are its own as soon as they are made: EOS is held back for batch.hold frames
                # (min_new_tokens; upstream's 2 is FIRST_CHUNK), and none comes after its frame limit
                ready = max(known - at, min(run - at, self.batch.hold, live.stop)) >= done + n
            else:
                n = known - at - done
                # a row's first chunk, its next ones every FIRST_GRID frames until it is in step with LIVE_CHUNK, then
                # every LIVE_CHUNK frames
                ready = known > at and (not done or known % LIVE_CHUNK == 0 or (at + done) % LIVE_CHUNK)
            if ready:
                first = live.start + done
                due[n].append((row, self.batch.st.frames[slot, first:first + n], False))
        self._feed(due)

    def finish(self) -> None:
        """The batch has stopped: the last frames of the rows that ended."""
        self._feed(self._rests())

    def _rests(self) -> collections.defaultdict:
        """Each ended row's frames not yet decoded, in a call of the chunks' sizes or call_frames'."""
        due = collections.defaultdict(list)  # call frames -> [(row, its frames, ended)]
        for row, codes in self.ended:
            rest = codes[self.codec.done(row):]
            if not rest.shape[0]:
                self.codec.end(row)
                continue
            # the size of a call the live rows' chunks make at this mark anyway, where the rest fits
            size = next((n for n in self.sizes if rest.shape[0] <= n), None) or call_frames(rest.shape[0])
            due[size].append((row, rest, True))
        self.ended = []
        return due

    def _feed(self, due: dict) -> None:
        """One CodecStream.feed per call size, smallest first; it copies the frames out on the frame loop's stream."""
        for size, items in sorted(due.items()):
            rows, frames, ended = zip(*items, strict=True)
            self.codec.feed(rows, frames, size, ended)
