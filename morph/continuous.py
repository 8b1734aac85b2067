"""A render's rows through one running batch (morph/decode/slots.py), their audio through the codec stream
(morph/codec/stream.py) as each row ends: what BatchTTS.render(continuous=True) runs (not in eager mode).

Rows join longest first, in groups as slots free up; each group's prompt is built by upstream's own generate
(MorphPatch.prompt_of), and each row draws from its own random stream (morph/decode/streams.py), keyed by the
seed and the row (morph/prompts.py), so its take does not depend on its neighbours.
"""

from __future__ import annotations

import collections
from typing import Callable, Sequence

import torch

from .codec.stream import CodecStream
from .lines.line import Row
from .prompts import prompt_inputs, prompt_tokens, stream_keys, token_count
from .settings import GenerationSettings

_PROMPT = ("inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed")


def runs_lean(tts) -> bool:
    """Whether a render runs the lean path (the continuous batch, the lean codec): in every mode but eager, as the
    mode runs on this device."""
    from .decode import runner  # the decode path loads with a model, not with the nodes

    return runner.resolve(tts.patch.mode, tts.device, tts.patch.loop.lean_check) != "eager"


def run_rows(tts, rows: Sequence[Row], settings: GenerationSettings, width: int, stop: Callable[[Row], int],
             on_row: Callable[[Row, object], None], on_frames: Callable[[int], None] | None = None,
             audio: bool = True) -> None:
    """Render `rows` `width` at a time; on_row(row, float32 audio) as each is decoded (with audio=False:
    on_row(row, codes [frames, 16]) as each ends, no codec); on_frames(live rows) before each frame. stop(row):
    the frame at which the row ends at the latest. A CUDA out-of-memory error propagates as it is."""
    from .decode.slots import ContinuousBatch, Group  # the decode path loads with a model, not with the nodes

    model, patch = tts.tts, tts.patch
    pending = collections.deque(sorted(zip(rows, stream_keys(rows, settings.seed), strict=True),
                                       key=lambda rk: (-rk[0].limit, -len(rk[0].text))))
    count = token_count(tts)
    need = max(prompt_tokens(r.text, r.line.voice, r.line.instruct, count) + stop(r) + 1 for r in rows)
    patch.seq_groups = settings.seq_groups

    def capture(n: int) -> tuple[dict, "Group"] | None:
        chunk = [pending.popleft() for _ in range(min(n, len(pending)))]
        if not chunk:
            return None
        group_rows = [r for r, _ in chunk]
        longest = max(group_rows, key=lambda r: r.limit)
        kwargs = model._merge_generate_kwargs(**settings.upstream_kwargs(longest.text))
        inputs = prompt_inputs(tts, group_rows)
        got = patch.prompt_of(lambda: model.model.generate(languages=[r.line.language for r in group_rows],
                                                           **inputs, **kwargs))
        return got, Group(group_rows, {k: got[k] for k in _PROMPT}, [stop(r) for r in group_rows],
                          [k for _, k in chunk])

    first = capture(width)
    batch = ContinuousBatch(tts.patch.loop, width, need, first[0], settings.seq_groups, patch.mode, tts.device,
                            model.model.dtype)
    queued = [first[1]]

    def next_group(n: int) -> "Group | None":
        if queued:
            return queued.pop()
        got = capture(n)
        return None if got is None else got[1]

    if not audio:
        batch.run(next_group, on_row, on_frames)
        return
    codec = CodecStream(tts.codec, tts.device, tts.codec.side_stream(tts.device))

    def ended(row: Row, codes: torch.Tensor) -> None:
        codec.submit(row, codes, None if row.line.voice is None else row.line.voice.ref_code)

    def frame(live: int) -> None:
        for row, wav in codec.pump():
            on_row(row, wav)
        if on_frames is not None:
            on_frames(live)

    try:
        batch.run(next_group, ended, frame)
    finally:  # rows that ended before a failure or a cancel are still decoded and handed over
        for row, wav in codec.pump(flush=True):
            on_row(row, wav)
