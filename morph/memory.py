"""How much device memory a run needs beyond the weights, for a host's memory manager to make room.

An estimate on the high side, from the loaded model's shape:
  - the talker's KV cache: every row keeps keys and values for its prompt and its frames
    (2 x layers x kv heads x head dim per token; the code predictor's 16-position cache is negligible);
  - the prefill's activations: each row's prompt through one MLP at a time;
  - DECODE_ALLOWANCE for the 12 Hz codec decoding a line (chunks of 300 frames) and the kernels' workspaces.
Measured on an H200 (0.6B, bf16): Render Lines at batch 32 with 5 s lines peaked 1.45 GiB above the weights;
this estimate gives about 2.3 GiB for such lines.
"""

from __future__ import annotations

from typing import Sequence

from .lines.text_split import MAX_SEGMENT_CHARS, split_text
from .lines.voice import Voice
from .settings import GenerationSettings

DECODE_ALLOWANCE = 512 * 2**20
PROMPT_OVERHEAD_TOKENS = 32  # chat markup, codec control tokens, the speaker embedding


def prompt_tokens(text: str, voice: Voice | None = None, instruct: str = "") -> int:
    """At most one token per character of text, plus an ICL voice's transcript and reference frames."""
    tokens = len(text) + len(instruct) + PROMPT_OVERHEAD_TOKENS
    if voice is not None and voice.icl:
        tokens += len(voice.ref_text or "") + int(voice.ref_code.shape[0])
    return tokens


def working_memory(tts, lines: Sequence[tuple[str, Voice | None]], settings: GenerationSettings | None = None,
                   batch_size: int | None = None, instruct: str = "") -> int:
    """Bytes that rendering `lines` ((text, voice) pairs), `batch_size` rows at a time (None: all at once),
    needs beyond the weights. A text over MAX_SEGMENT_CHARS counts as its segments, each a row of its own.
    """
    settings = settings or GenerationSettings()
    rows = []
    for text, voice in lines:
        text = text.strip()
        for segment in split_text(text) if len(text) > MAX_SEGMENT_CHARS else [text]:
            frames = settings.upstream_kwargs(segment)["max_new_tokens"]
            rows.append((prompt_tokens(segment, voice, instruct), frames))
    if not rows:
        return 0
    rows.sort(key=lambda r: -(r[0] + r[1]))
    width = len(rows) if batch_size is None else min(max(int(batch_size), 1), len(rows))
    config = tts.tts.model.config.talker_config
    itemsize = tts.tts.model.dtype.itemsize
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * itemsize
    batch = rows[:width]  # the largest rows, batched together
    cache = kv_per_token * width * max(p + f for p, f in batch)
    prefill = width * max(p for p, _ in batch) * (3 * config.intermediate_size + 4 * config.hidden_size) * itemsize
    return int(cache + prefill + DECODE_ALLOWANCE)
