"""What a run needs on the device beyond the weights, for a host's memory manager (ComfyUI's `memory_required`) and the
engine's admission, counted from the model's shape: the continuous batch's pool, state, prompts, a prefill slice and
codec calls at once (codec beside prefill); a static batch's state and the larger of its prefill and codec call."""

from __future__ import annotations

from typing import Sequence

import torch

from .codec.calls import LIVE_CHUNK, live_row_frames
from .codec.pieces import DECODE_ROW_FRAMES, UPSTREAM_CHUNK, UPSTREAM_CONTEXT, row_frames
from .graphs import FRAME_LOOP, PROMPTS, side_stream_made
from .lines.line import Row
from .lines.text_split import MAX_SEGMENT_CHARS, split_text
from .lines.voice import Voice
from .masked_attention import SCORES_BYTES
from .prompts import prefill_tokens, prompt_tokens, token_count
from .settings import (KV_PAGE, GenerationSettings, capacity_for, prefill_bucket, prefill_rows, requeue_pool_pages,
                       runs_lean, text_slots)

# Fits to the peaks of tests/gpu/test_memory.py (0.6B, bf16, fused, 5 s lines), each naming its bench/results folder.
# Upstream's decoder (eager's): live values a row-frame in its dtype, workspace beyond WORKSPACE (h100-2026-11-23)
CODEC_VALUES_PER_ROW_FRAME = 1_250_000
UPSTREAM_CODEC_WORKSPACE = 80 * 2**20
WORKSPACE = 64 * 2**20  # every run's, above the start of a fresh process's batch-1 render (h100-2026-11-24c)
STREAM_WORKSPACE = 32 * 2**20  # cuBLAS's on each of the batch's own streams, taken at its first use (h200-2026-11-26f)
# The lean codec: bytes a row-frame of a chunk call of many rows and of one, cuDNN's workspaces included, op by op and
# replayed from CUDA graphs; each row's float32 audio is held AUDIO_COPIES times on the device (h100-2026-11-26g)
LEAN_CODEC_BYTES = (int(1.45 * 2**20), int(1.85 * 2**20))
CAPTURED_CODEC_BYTES = (int(1.85 * 2**20), int(2.5 * 2**20))
LEAN_CODEC_WORKSPACE = 16 * 2**20
AUDIO_COPIES = 6
# The live codec's kept graphs hold their calls' activations (in CUDA's graph pool under cudaMallocAsync, in private
# pools the native allocator fragments): a share of the widest call's op-by-op bytes (h100-2026-11-26f)
ASYNC_CAPTURED_SHARE = 1.15
NATIVE_CAPTURED_SHARE = (1.0, 10, 3.0)  # 1 + rows / 10, at most 3
CAPTURED_GRAPHS = 64 * 2**20  # the frame step's graphs, one per width bucket, and the smaller codec shapes' leftovers
# What the device loses beyond the counted allocations: the allocator's reserve (freed blocks another stream cannot
# take yet, split blocks, private pools' free blocks) and CUDA's graph pool past CAPTURED_GRAPHS (h200-2026-11-28c)
RESERVE_SHARE, CHURN_SHARE, EAGER_RESERVE_SHARE = 1.15, 1.4, 1.25
RESERVE_FIXED = {"cudaMallocAsync": int(0.4 * 2**30), "native": int(0.25 * 2**30)}
NATIVE_UPSTREAM_CODEC_SHARE = 1.6  # its large convolutions' blocks cached whole (h200-2026-11-28g)


def _rows(lines, settings: GenerationSettings, instruct: str, count) -> list[tuple[int, int, int]]:
    """(prompt tokens, frames, codec frames) of every row: a text over MAX_SEGMENT_CHARS is its segments."""
    rows = []
    for text, voice in lines:
        text = text.strip()
        ref = _reference_frames(voice)
        for segment in split_text(text) if len(text) > MAX_SEGMENT_CHARS else [text]:
            frames = settings.frame_limit(segment)
            rows.append((prompt_tokens(segment, voice, instruct, count), frames, ref + frames))
    return rows


def working_memory(tts, lines: Sequence[tuple[str, Voice | None]], settings: GenerationSettings | None = None,
                   batch_size: int | None = None, instruct: str = "", device: torch.device | None = None) -> int:
    """Bytes beyond the weights to render (text, voice) `lines` `batch_size` rows at a time (None: all) on `device`."""
    count = token_count(tts)
    rows = _rows(lines, settings or GenerationSettings(), instruct, count)
    if not rows:
        return 0
    width = len(rows) if batch_size is None else min(max(int(batch_size), 1), len(rows))
    model = tts.tts.model
    shape = _Shape(model)
    if runs_lean(tts, device):
        prefill = max(prefill_tokens(text, voice, instruct, count) for text, voice in lines)
        return _continuous(tts, shape, rows, prefill, width, replays_graphs(tts, device), device or tts.device)
    rows.sort(key=lambda r: -(r[0] + r[1]))
    batch = rows[:width]  # the largest rows, batched together
    prompt = max(p for p, _, _ in batch)
    tokens = prompt + max(f for _, f, _ in batch) + 1  # the batch's prompts left-padded to the longest, its frames
    # upstream's DynamicCache holds the tokens the batch has reached; the loop's hidden states take every slot
    state = width * (tokens * shape.kv_per_token + capacity_for(tokens) * 2 * shape.hidden_bytes)
    prefill = width * prompt * (shape.kv_per_token + shape.layer_bytes_per_token + shape.heads * prompt * 4)
    heaviest = row_frames(max(c for _, _, c in rows))  # the heaviest call morph/codec/pieces.py makes of the rows
    codec = _upstream_codec_call(model, min(width * heaviest, max(DECODE_ROW_FRAMES, heaviest)))
    share = 1.0
    if (device or tts.device).type == "cuda":
        share = EAGER_RESERVE_SHARE
        if torch.cuda.get_allocator_backend() == "native":
            codec *= NATIVE_UPSTREAM_CODEC_SHARE
    return int(share * (state + max(prefill, codec)) + WORKSPACE)


def batch_need(tts, rows: Sequence[Row], prompts: Sequence[int], width: int) -> int:
    """Bytes a batch of `width` slots takes for these waiting rows: what the engine admits against free_bytes."""
    sized = [(p, r.limit, _reference_frames(r.line.voice) + r.limit) for r, p in zip(rows, prompts, strict=True)]
    prefill = max(p if r.line.voice is None else prefill_tokens(r.text, r.line.voice)
                  for r, p in zip(rows, prompts, strict=True))
    return _continuous(tts, _Shape(tts.tts.model), sized, prefill, width, replays_graphs(tts, None), tts.device)


def free_bytes(device: torch.device) -> int | None:
    """What this process may still take on a CUDA device: the driver's free memory and what torch's allocator holds
    unused, within the native allocator's per-process fraction (bench.cards' smaller card). None off CUDA."""
    if device.type != "cuda":
        return None
    # a model loaded on "cuda" has no index, which torch's per-process fraction refuses
    index = torch.cuda.current_device() if device.index is None else device.index
    free, total = torch.cuda.mem_get_info(index)
    allocated = torch.cuda.memory_allocated(index)
    room = free + torch.cuda.memory_reserved(index) - allocated
    if torch.cuda.get_allocator_backend() == "native":
        room = min(room, int(torch.cuda.get_per_process_memory_fraction(index) * total) - allocated)
    return max(0, room)


def _reference_frames(voice: Voice | None) -> int:
    """The frames of an ICL voice's reference, which the codec decodes ahead of the row's own."""
    return int(voice.ref_code.shape[0]) if voice is not None and voice.icl else 0


def replays_graphs(tts, device: torch.device | None = None) -> bool:
    from .decode.runner import FAST_MODES  # the decode path loads with a model, not with the nodes

    return tts.patch.resolved_mode(device or tts.device) in FAST_MODES


def _continuous(tts, shape: "_Shape", rows: list[tuple[int, int, int]], prompt: int, width: int,
                captured: bool, device: torch.device) -> int:
    """The continuous batch's need on `device`; prompt: the longest row's prefill tokens; captured: graphs replay."""
    needs = [p + f + 1 for p, f, _ in rows]  # prompt, frames and the EOS slot (morph/engine/request.py)
    pool = requeue_pool_pages([(p, f) for p, f, _ in rows], width) * KV_PAGE * shape.kv_per_token
    # the text table, and the frames and tokens at the capacity
    state = width * (text_slots(max(p for p, _, _ in rows)) * shape.hidden_bytes
                     + capacity_for(2 * max(needs)) * (shape.groups + 1) * 8)
    # a slice of a group (morph/decode/groups.py), in the fast modes padded to its bucket, whose graph's arena holds
    # its inputs and keys and values and whose scratch a layer's activations (morph/decode/prefill_graphs.py)
    rows_in = min(width, prefill_rows(prompt))
    rows_in, prompt = (prefill_bucket(rows_in, prompt) if captured else None) or (rows_in, prompt)
    tokens = rows_in * prompt
    prefill = (tokens * (shape.kv_per_token + shape.layer_bytes_per_token)
               + min(SCORES_BYTES, tokens * shape.heads * prompt * 4))
    # calls of LIVE_CHUNK frames, rows padded to a power of two; every live row's codec state, and a copy of its rows'
    # states in a call and in its graph
    per_call = live_row_frames(width) // LIVE_CHUNK
    codec_frames = [c for _, _, c in rows]
    restart = _lean_codec_call(_live_row_call(codec_frames), 1)
    if captured:
        # op by op beside the graphs: a window's restart, an ICL voice's priming
        beside = 0
        if max(codec_frames) > UPSTREAM_CHUNK:
            beside = restart
        elif any(c > f for _, f, c in rows):
            beside = _lean_codec_call(LIVE_CHUNK, 1)
        codec = _captured_codec_calls(LIVE_CHUNK, per_call) + beside
    else:
        codec = max(_lean_codec_call(LIVE_CHUNK, per_call), restart)
    row_state = sum(t * c for t, c in tts.codec.slot_shapes()) * _codec_itemsize(tts.tts.model)  # a row's left context
    codec += (width + 2 * per_call) * row_state
    codec += AUDIO_COPIES * 4 * tts.codec.upsample * LIVE_CHUNK * per_call
    ahead = len(rows) > width  # a next group's prompt is built while one joins (morph/engine/runner.py), on its stream
    prompts = (1 + ahead) * width * max(p for p, _, _ in rows) * shape.hidden_bytes
    roles = (FRAME_LOOP, PROMPTS) if ahead else (FRAME_LOOP,)
    streams = STREAM_WORKSPACE * sum(not side_stream_made(device, role) for role in roles)
    counted = pool + state + prefill + codec + prompts
    if device.type == "cuda":
        counted = through_reserve(counted, ahead, torch.cuda.get_allocator_backend())
    return int(counted + WORKSPACE + streams)


def through_reserve(counted: float, churn: bool, backend: str) -> float:
    """What a continuous render allocating `counted` bytes takes of a CUDA device under the allocator `backend`,
    reserve and graph pool included; churn: more rows than its width join as others end."""
    return (CHURN_SHARE if churn else RESERVE_SHARE) * counted + RESERVE_FIXED[backend]


class _Shape:
    """What a token and a slot weigh in the talker (its dtype's bytes)."""

    def __init__(self, model):
        config, itemsize = model.config.talker_config, model.dtype.itemsize
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * itemsize
        self.hidden_bytes = config.hidden_size * itemsize
        # one layer's activations a token: the MLP's three projections and a few hidden-sized tensors
        self.layer_bytes_per_token = (3 * config.intermediate_size + 4 * config.hidden_size) * itemsize
        self.heads = config.num_attention_heads
        self.groups = config.num_code_groups


def _lean_codec_call(frames: int, rows: int) -> int:
    """One lean codec call of `rows` rows of `frames` frames, op by op: its activations and cuDNN's workspaces."""
    return LEAN_CODEC_BYTES[rows == 1] * rows * frames + LEAN_CODEC_WORKSPACE


def _captured_codec_calls(frames: int, rows: int) -> int:
    """The live codec's graphs, the widest a call of `rows` x `frames`, and the frame step's, under this allocator."""
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        share = ASYNC_CAPTURED_SHARE
    else:
        base, rows_per_step, most = NATIVE_CAPTURED_SHARE
        share = min(most, base + rows / rows_per_step)
    return int(share * CAPTURED_CODEC_BYTES[rows == 1] * rows * frames) + CAPTURED_GRAPHS


def _live_row_call(codec_frames: list[int]) -> int:
    """Frames of a live row's largest one-row call: a chunk, plus the context of a window's restart."""
    return LIVE_CHUNK + (UPSTREAM_CONTEXT if max(codec_frames) > UPSTREAM_CHUNK else 0)


def _upstream_codec_call(model, frames: int) -> int:
    """A call of upstream's decoder over `frames` row-frames (0: no call): its activations and workspaces."""
    return CODEC_VALUES_PER_ROW_FRAME * _codec_itemsize(model) * frames + UPSTREAM_CODEC_WORKSPACE if frames else 0


def _codec_itemsize(model) -> int:
    """The codec's own precision: it is loaded apart from the talker (a plain attribute, not a submodule)."""
    return next(model.speech_tokenizer.model.parameters()).dtype.itemsize
