"""Upstream's decode of finished rows (the exact reference, mode eager) in pieces of at most DECODE_ROW_FRAMES
row-frames, rows of like length together: upstream's one call for a wide batch peaks at several times the weights. A
row's audio is its one-call decode to rounding; stream.py's decode_whole uses the same pieces."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..settings import SAMPLE_RATE

UPSTREAM_CHUNK, UPSTREAM_CONTEXT = 300, 25  # upstream's chunked_decode: 300 frames at a time, 25 before each
CODEC_WINDOW = UPSTREAM_CHUNK + UPSTREAM_CONTEXT  # frames the decoder runs at once
DECODE_ROW_FRAMES = 512  # the most row-frames of one codec call


def row_frames(frames: int) -> int:
    """What one row of `frames` frames weighs in a codec call."""
    return min(int(frames), CODEC_WINDOW)


def call_rows(chunk: int, budget: int = DECODE_ROW_FRAMES) -> int:
    """Rows one decode call takes when each brings `chunk` frames: as many as `budget` row-frames allow, or one."""
    return max(1, budget // chunk)


def pieces(lengths: Sequence[int], budget: int = DECODE_ROW_FRAMES) -> list[list[int]]:
    """Row indices grouped for codec calls, rows of similar length together, each piece's rows times its longest within
    `budget` (a heavier row alone); rows without frames are in no piece."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * row_frames(lengths[i]) <= budget:
            groups[-1].append(i)  # the order is ascending, so row i is this piece's longest
        else:
            groups.append([i])
    return [sorted(group) for group in groups]  # rows in the order given, as one upstream call would hold them


def decode_rows(tokenizer, codes: Sequence[torch.Tensor], refs: Sequence[torch.Tensor | None],
                budget: int = DECODE_ROW_FRAMES) -> list[np.ndarray]:
    """Float32 24 kHz audio of each row's codes [frames, 16] through qwen-tts's 12 Hz `tokenizer`. refs[i], an ICL
    voice's reference codes, go in front of row i as upstream decodes them, and their audio is cut off again."""
    full = [c if r is None else torch.cat([r.to(c.device), c]) for c, r in zip(codes, refs, strict=True)]
    audio = [np.zeros(0, np.float32) for _ in codes]
    # a row without frames goes to no piece: the codec cannot decode an empty batch
    for piece in pieces([f.shape[0] if c.shape[0] else 0 for f, c in zip(full, codes, strict=True)], budget):
        wavs, sr = tokenizer.decode([{"audio_codes": full[i]} for i in piece])
        assert sr == SAMPLE_RATE, f"the 12 Hz codec decodes at {SAMPLE_RATE} Hz, got {sr}"
        for i, wav in zip(piece, wavs, strict=True):
            cut = 0 if refs[i] is None else int(refs[i].shape[0] / full[i].shape[0] * wav.shape[0])
            audio[i] = np.asarray(wav[cut:], dtype=np.float32)
    return audio
