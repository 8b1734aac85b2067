"""A slice's prefill replayed from its bucket's CUDA graph in the fast modes, sparing the host its launches; a slice is
padded to its bucket, the padding masked. All buckets' graphs share one arena as large as the largest so far: a slice's
outputs are read only until the next prefill. Past the longest bucket, or once a batch's capture failed, op by op."""

from __future__ import annotations

import torch

from ..graphs import CAPTURE, GraphCache
from ..settings import PREFILL_LENGTHS, prefill_bucket, prefill_rows
from .lean import Prefilled, lean_prefill, rope_tables


def _lean(loop, embeds, mask, cos, sin, into=None) -> Prefilled:
    t = loop.talker
    return lean_prefill(embeds, mask, loop.stack.weights(), t.model.norm.weight, t.codec_head.weight, cos, sin,
                        loop.stack.dims, into=into)

MAX_SHAPES = 16  # graphs kept: a script's groups meet a few prompt lengths, each at one or two row counts
# A server's rows join one or two at a time: its engine captures their buckets before its first request (warm).
LIVE_ROWS = (1, 2)


def largest_first(shapes) -> list[tuple[int, int]]:
    """Buckets (rows, tokens) in the order PrefillGraphs.warm captures them: the arena is sized once, by the first."""
    return sorted(shapes, key=lambda s: (-s[0] * s[1], -s[0]))


def live_shapes(longest: int) -> list[tuple[int, int]]:
    """The buckets a server's joins meet, its prompts `longest` tokens at most, the largest first."""
    bucket = prefill_bucket(1, longest)  # None: past the longest, which runs op by op
    lengths = [n for n in PREFILL_LENGTHS if bucket is None or n <= bucket[1]]
    return largest_first((rows, n) for rows in LIVE_ROWS for n in lengths)


def voice_shapes(length: int, width: int) -> list[tuple[int, int]]:
    """The buckets, largest first, a render's rows of one voice meet: prompts `length` tokens, at most `width` rows."""
    if prefill_bucket(1, length) is None:
        return []
    most = min(width, prefill_rows(length))
    return [prefill_bucket(1 << k, length) for k in reversed(range((most - 1).bit_length() + 1))]


class Arena:
    """What every bucket's graph reads and writes, flat, for `tokens` tokens of prompt, and the rotary tables."""

    def __init__(self, loop, tokens: int, embeds: torch.Tensor, mask: torch.Tensor):
        t, d = loop.talker, loop.stack.dims
        device, hidden, rows = embeds.device, embeds.shape[-1], tokens // PREFILL_LENGTHS[0]
        self.tokens = tokens
        self.embeds = torch.zeros(tokens * hidden, dtype=embeds.dtype, device=device)
        self.mask = torch.zeros(tokens, dtype=mask.dtype, device=device)
        self.kv = [(torch.zeros(tokens * d.kv_size, dtype=embeds.dtype, device=device),
                    torch.zeros(tokens * d.kv_size, dtype=embeds.dtype, device=device))
                   for _ in range(loop.config.num_hidden_layers)]
        head, norm = t.codec_head.weight, t.model.norm.weight
        self.logits = torch.zeros(rows * head.shape[0], dtype=head.dtype, device=device)
        self.hidden = torch.zeros(rows * hidden, dtype=norm.dtype, device=device)
        self.cos, self.sin = rope_tables(t.model.rotary_emb, PREFILL_LENGTHS[-1], device, embeds.dtype, multimodal=True)


class Bucket:
    """One bucket's views of an arena: `rows` prompts of `length` tokens in, their prefill out."""

    def __init__(self, arena: Arena, loop, rows: int, length: int):
        d, hidden, vocab = loop.stack.dims, loop.config.hidden_size, loop.talker.codec_head.weight.shape[0]
        n = rows * length
        self.loop, self.rows, self.length = loop, rows, length
        self.embeds = arena.embeds[:n * hidden].view(rows, length, hidden)
        self.mask = arena.mask[:n].view(rows, length)
        self.kv = [tuple(t[:n * d.kv_size].view(rows, d.kv_heads, length, d.head_dim) for t in pair)
                   for pair in arena.kv]
        self.logits = arena.logits[:rows * vocab].view(rows, vocab)
        self.hidden = arena.hidden[:rows * hidden].view(rows, 1, hidden)
        self.cos, self.sin = arena.cos, arena.sin

    def load(self, embeds: torch.Tensor, mask: torch.Tensor) -> None:
        """A slice's prompts into the bucket's first rows, right-aligned: the rest is padding."""
        rows, length = mask.shape
        self.mask.zero_()
        self.mask[:rows, self.length - length:].copy_(mask)
        self.embeds[:rows, self.length - length:].copy_(embeds)

    def step(self) -> None:
        """The bucket's prefill, from its inputs into its outputs: what its graph captures."""
        out = _lean(self.loop, self.embeds, self.mask, self.cos, self.sin, into=self.kv)
        self.logits.copy_(out.logits)
        self.hidden.copy_(out.past_hidden)

    def out(self, rows: int, length: int) -> Prefilled:
        """The loaded slice's outputs, shaped as lean_prefill over the slice alone gives them."""
        lo = self.length - length
        return Prefilled([(k[:rows, :, lo:], v[:rows, :, lo:]) for k, v in self.kv], self.logits[:rows],
                         self.hidden[:rows])


class PrefillGraphs:
    """A TalkerLoop's prefills of joining rows: replayed per bucket in the fast modes, op by op otherwise."""

    def __init__(self):
        self.graphs = GraphCache(max_graphs=MAX_SHAPES, role=CAPTURE, warmup=1)
        self._arena: Arena | None = None
        self._buckets: dict[tuple[int, int], Bucket] = {}

    def bind(self, owner) -> None:
        """At a batch's start: drop the graphs and their arena as GraphCache.bind drops its graphs."""
        self.graphs.bind(owner)
        if not len(self.graphs):
            self._drop()

    def clear(self) -> None:
        self.graphs.clear()
        self._drop()

    def prefill(self, loop, embeds: torch.Tensor, mask: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor],
                captured: bool) -> Prefilled:
        shape = prefill_bucket(*mask.shape) if captured and not self.graphs.failed else None
        out = None if shape is None else self._replayed(loop, shape, embeds, mask)
        return _lean(loop, embeds, mask, *tables) if out is None else out

    def warm(self, loop, shapes: list[tuple[int, int]], dtype: torch.dtype) -> None:
        """Capture the buckets of `shapes` (rows, tokens) now, in the order given, and keep them beside MAX_SHAPES
        others: a server's engine does, before its first request, so no join of one captures in its path."""
        self.graphs.max_graphs = max(self.graphs.max_graphs, len(shapes) + MAX_SHAPES)
        device, hidden = loop.talker.codec_head.weight.device, loop.config.hidden_size
        for rows, length in shapes:
            embeds = torch.zeros(rows, length, hidden, dtype=dtype, device=device)
            mask = torch.ones(rows, length, dtype=torch.long, device=device)
            if self._replayed(loop, (rows, length), embeds, mask) is None:
                return

    def _replayed(self, loop, shape: tuple[int, int], embeds: torch.Tensor, mask: torch.Tensor) -> Prefilled | None:
        """The slice's prefill from its bucket's graph, captured first if new; None where a capture failed (logged)."""
        bucket = self._bucket(loop, shape, embeds, mask)
        bucket.load(embeds, mask)
        try:
            entry = self.graphs.get_or_none(shape, bucket.step, "morph: could not capture the prefill of joining "
                                            "rows (%s); it runs op by op for the rest of this batch, slower to "
                                            "the first audio. If this repeats, report it")
        except torch.cuda.OutOfMemoryError:
            self._drop()
            raise
        if entry is None:
            self._drop()
            return None
        entry.replay()
        return bucket.out(*mask.shape)

    def _bucket(self, loop, shape: tuple[int, int], embeds: torch.Tensor, mask: torch.Tensor) -> Bucket:
        """The bucket of `shape`; a larger arena drops every graph of the old one."""
        rows, length = shape
        arena = self._arena
        if arena is None or arena.tokens < rows * length or arena.embeds.dtype != embeds.dtype:
            self.graphs.drop()
            self._drop()
            # a power of two of tokens: an arena is replaced a few times a process at most
            self._arena = arena = Arena(loop, 1 << (rows * length - 1).bit_length(), embeds, mask)
        if shape not in self._buckets:
            self._buckets[shape] = Bucket(arena, loop, rows, length)
        return self._buckets[shape]

    def _drop(self) -> None:
        self._arena = None
        self._buckets.clear()
