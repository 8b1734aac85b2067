"""The 12 Hz codec's decoder, lean and streaming, on upstream's weights: codes [rows, frames, 16] to 24 kHz audio a
chunk at a time. Every layer is causal, so a row carrying its left context (`CodecState`) decodes chunk by chunk to its
one-call decode's rounding. Channels last: cuDNN's tensor-core convolutions take that layout without a transpose."""

from __future__ import annotations

import collections
import hashlib
import logging

import torch
import torch.nn.functional as F

from ..errors import reason
from ..graphs import CODEC, CODEC_CAPTURE, GraphCache, side_stream
from ..masked_attention import masked_attention, rotate
from .calls import CHUNK

log = logging.getLogger(__name__)

PRIMED_VOICES = 32  # ICL voices whose decoded reference is kept
MAX_SHAPES = 32  # graphs kept: two chunk sizes at up to 8 widths each, and the rest's sizes of ended rows


def _conv_input(x: torch.Tensor) -> torch.Tensor:
    """x [B, T, C] seen as [B, C, 1, T] with channels-last strides: what cuDNN's NHWC kernels read as they are."""
    b, t, c = x.shape
    return x.view(b, 1, t, c).permute(0, 3, 1, 2)


def _conv_output(y: torch.Tensor) -> torch.Tensor:
    b, c, _, t = y.shape
    return y.permute(0, 2, 3, 1).reshape(b, t, c)


class CodecState:
    """Each row's left context, all slots' [time, channels] in one flat row (states join in one copy), and `pos`."""

    def __init__(self, flat: torch.Tensor, pos: torch.Tensor, shapes: list[tuple[int, int]]):
        self.flat, self.pos, self.shapes = flat, pos, shapes
        parts = flat.split([t * c for t, c in shapes], dim=1)
        self.slots = [part.view(-1, t, c) for part, (t, c) in zip(parts, shapes, strict=True)]

    def rows(self, start: int, stop: int) -> "CodecState":
        """Rows start..stop as views: decoding them advances these rows of this state."""
        return CodecState(self.flat[start:stop], self.pos[start:stop], self.shapes)

    @staticmethod
    def cat(states: list["CodecState"]) -> "CodecState":
        return CodecState(torch.cat([s.flat for s in states]), torch.cat([s.pos for s in states]), states[0].shapes)


class Cursor:
    """The state's slots in the order the layers use them: each layer takes its context and puts the next."""

    def __init__(self, state: CodecState):
        self.state, self.i = state, 0

    def swap(self, new: torch.Tensor) -> None:
        self.state.slots[self.i].copy_(new)  # in place: `state` may be rows of a larger one
        self.i += 1

    def take(self) -> torch.Tensor:
        return self.state.slots[self.i]


class LeanCodec:
    """The lean decoder over one loaded codec (qwen-tts's Qwen3TTSTokenizerV2Model)."""

    def __init__(self, codec_model: torch.nn.Module):
        self.model = codec_model
        self.decoder = codec_model.decoder
        cfg = self.decoder.config
        self.window = int(cfg.sliding_window) - 1  # a frame attends to itself and the sliding_window - 1 before it
        self.upsample = int(self.decoder.total_upsample)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.codebook_size = int(cfg.codebook_size)
        self._tables: tuple | None = None
        self._kernels = None  # morph/kernels/snake.py where it runs (_fused), else False
        self._primed: collections.OrderedDict = collections.OrderedDict()  # a reference's codes, where -> state
        self._captured: dict = {}  # device -> CapturedDecode

    # -- what the weights give, once per placement -------------------------------------------
    def _fingerprint(self) -> tuple:
        p = next(self.decoder.parameters())
        return p.device, p.dtype, p.data_ptr()

    def tables(self) -> dict:
        """Per-codebook embeddings (upstream divides them out at every decode) and per-activation tables."""
        if self._tables is None or self._tables[0] != self._fingerprint():
            with torch.inference_mode():
                q = self.decoder.quantizer
                books = [layer._codebook for rvq in (q.rvq_first, q.rvq_rest) for layer in rvq.vq.layers]
                codebooks = [b.embedding_sum / b.cluster_usage.clamp(min=b.epsilon)[:, None] for b in books]
                snakes = {id(m): (torch.exp(m.alpha), 1.0 / (torch.exp(m.beta) + m.no_div_by_zero))
                          for m in self.decoder.modules() if type(m).__name__ == "SnakeBeta"}
            self._tables = (self._fingerprint(), dict(codebooks=codebooks, snakes=snakes))
        return self._tables[1]

    def release(self) -> None:
        """Drop what is kept on the device besides the weights."""
        self._tables = None
        self._primed.clear()
        self._captured.clear()

    def captured(self, device) -> "CapturedDecode":
        """This codec's decode replayed from CUDA graphs on `device`, kept for the next render."""
        device = torch.device(device)
        if device not in self._captured:
            self._captured[device] = CapturedDecode(self, device)
        return self._captured[device]

    @staticmethod
    def side_stream(device) -> "torch.cuda.Stream | None":
        """The CUDA stream rows decode on beside the frame loop (None off CUDA)."""
        return side_stream(device, CODEC) if torch.device(device).type == "cuda" else None

    # -- the state -------------------------------------------------------------------------------
    def slot_shapes(self) -> list[tuple[int, int]]:
        """(time, channels) of every slot, in the order decode uses them."""
        d = self.decoder
        shapes = [self._conv_context(d.pre_conv.conv)]
        kv = (self.kv_heads * self.window, self.head_dim)
        shapes += [kv, kv] * len(d.pre_transformer.layers)
        shapes += [self._conv_context(block[1].dwconv.conv) for block in d.upsample]
        shapes.append(self._conv_context(d.decoder[0].conv))
        for block in d.decoder[1:-2]:
            shapes.append((1, block.block[1].conv.in_channels))  # the transposed convolution's last input
            shapes += [self._conv_context(unit.conv1.conv) for unit in block.block[2:]]
        shapes.append(self._conv_context(d.decoder[-1].conv))
        return shapes

    @staticmethod
    def _conv_context(conv: torch.nn.Conv1d) -> tuple[int, int]:
        return (conv.kernel_size[0] - 1) * conv.dilation[0], conv.in_channels

    def zero_state(self, rows: int, device, dtype) -> CodecState:
        """Rows that have seen nothing: upstream's zero padding on the left."""
        shapes = self.slot_shapes()
        return CodecState(torch.zeros(rows, sum(t * c for t, c in shapes), device=device, dtype=dtype),
                          torch.zeros(rows, dtype=torch.long, device=device), shapes)

    def primed(self, ref: torch.Tensor | None, device) -> CodecState:
        """One row's state after an ICL voice's reference codes [frames, 16] (zeros for none), decoded once a voice."""
        dtype = next(self.decoder.parameters()).dtype
        if ref is None:
            return self.zero_state(1, device, dtype)
        # by the codes themselves: a server reads a saved voice's codes again for each request
        codes = ref.detach().cpu().contiguous()
        key = (tuple(codes.shape), hashlib.blake2b(codes.numpy().tobytes(), digest_size=16).digest(),
               torch.device(device), self._fingerprint())
        state = self._primed.get(key)
        if state is None:
            state = self.zero_state(1, device, dtype)
            for piece in ref.to(device)[None].clamp(0, self.codebook_size - 1).split(CHUNK, dim=1):
                self.decode(piece, state)
            self._primed[key] = state
            while len(self._primed) > PRIMED_VOICES:
                self._primed.popitem(last=False)
        self._primed.move_to_end(key)
        return state

    # -- the decode ------------------------------------------------------------------------------
    def decode(self, codes: torch.Tensor, state: CodecState) -> torch.Tensor:
        """codes [B, T, 16] (in range) after what `state` has seen -> float32 audio [B, T * upsample], `state` moved."""
        d, tabs, cur = self.decoder, self.tables(), Cursor(state)
        with torch.inference_mode():
            x = self._quantized(codes, tabs["codebooks"])
            x = self._conv(x, d.pre_conv.conv, cur)
            x = self._transformer(x, state.pos, cur)
            for transposed, block in d.upsample:
                x = self._transposed(x, transposed.conv, None)
                x = self._convnext(x, block, cur)
            x = self._conv(x, d.decoder[0].conv, cur)
            for block in d.decoder[1:-2]:
                snake, transposed, *units = block.block
                x = self._transposed(self._snake(x, snake, tabs), transposed.conv, cur)
                for unit in units:
                    x = x + F.linear(self._unit(x, unit, tabs, cur), unit.conv2.conv.weight[..., 0],
                                     unit.conv2.conv.bias)
            x = self._conv(self._snake(x, d.decoder[-2], tabs), d.decoder[-1].conv, cur)
            state.pos += codes.shape[1]
            return x.clamp(min=-1, max=1).reshape(x.shape[0], -1).float()

    def _quantized(self, codes: torch.Tensor, books: list[torch.Tensor]) -> torch.Tensor:
        """The split residual quantizer's decode, upstream's sums in upstream's order: [B, T, codebook_dim]."""
        q = self.decoder.quantizer
        first = F.embedding(codes[..., 0], books[0])
        rest = F.embedding(codes[..., 1], books[1])
        for k in range(2, len(books)):
            rest = rest + F.embedding(codes[..., k], books[k])
        return (F.linear(first, q.rvq_first.output_proj.weight[..., 0])
                + F.linear(rest, q.rvq_rest.output_proj.weight[..., 0]))

    @staticmethod
    def _conv(x: torch.Tensor, conv: torch.nn.Conv1d, cur: Cursor) -> torch.Tensor:
        """A causal convolution (stride 1) of x [B, T, C], its left context from the state."""
        context = (conv.kernel_size[0] - 1) * conv.dilation[0]
        if context:
            x = torch.cat((cur.take(), x), dim=1)
            cur.swap(x[:, x.shape[1] - context:])
        if conv.groups > 1 or conv.out_channels == 1:
            # no channels-last tensor-core kernel for depthwise or one-channel convolutions: upstream's layout
            return F.conv1d(x.transpose(1, 2), conv.weight, conv.bias, groups=conv.groups).transpose(1, 2)
        dilation = conv.dilation[0]
        if dilation == 1:
            return _conv_output(F.conv2d(_conv_input(x), conv.weight.unsqueeze(2), conv.bias))
        # `dilation` plain convolutions over interleaved samples (cuDNN's dilated kernels are erratically slow): pad to
        # whole phases, split, merge.
        b, t, c = x.shape
        out = t - context
        phases = -(-out // dilation)
        x = F.pad(x, (0, 0, 0, phases * dilation + context - t))
        x = x.view(b, -1, dilation, c).transpose(1, 2).reshape(b * dilation, -1, c)
        y = _conv_output(F.conv2d(_conv_input(x), conv.weight.unsqueeze(2), conv.bias))  # [b * dilation, phases, C]
        return y.view(b, dilation, phases, -1).transpose(1, 2).reshape(b, phases * dilation, -1)[:, :out]

    @staticmethod
    def _transposed(x: torch.Tensor, conv: torch.nn.ConvTranspose1d, cur: Cursor | None) -> torch.Tensor:
        """Upstream's causal transposed convolution; with `cur`, the last input before goes first (blocks overlap)."""
        stride = conv.stride[0]
        if cur is not None:
            x = torch.cat((cur.take(), x), dim=1)
            cur.swap(x[:, -1:])
        y = _conv_output(F.conv_transpose2d(_conv_input(x), conv.weight.unsqueeze(2), conv.bias, stride=(1, stride)))
        return y[:, stride: stride + (x.shape[1] - 1) * stride] if cur is not None else y

    def _convnext(self, x: torch.Tensor, block, cur: Cursor) -> torch.Tensor:
        y = self._conv(x, block.dwconv.conv, cur)
        y = F.layer_norm(y, block.norm.normalized_shape, block.norm.weight, block.norm.bias, block.norm.eps)
        y = block.pwconv2(block.act(block.pwconv1(y)))
        return x + block.gamma * y

    def _unit(self, x: torch.Tensor, unit, tabs: dict, cur: Cursor) -> torch.Tensor:
        """A residual unit: activation, dilated convolution, activation; on CUDA the kernels skip _conv's copies."""
        conv = unit.conv1.conv
        kernels, (b, t, c) = self._fused(x.device), x.shape
        dilation, lead = conv.dilation[0], conv.kernel_size[0] - 1  # lead: phases of context in front of each row
        context = lead * dilation
        if kernels is None or t < context:  # a call shorter than the context (a voice's last reference frame)
            return self._snake(self._conv(self._snake(x, unit.act1, tabs), conv, cur), unit.act2, tabs)
        first, second = tabs["snakes"][id(unit.act1)], tabs["snakes"][id(unit.act2)]
        phases = lead + -(-t // dilation)
        window = torch.empty(b * dilation, phases, c, dtype=x.dtype, device=x.device)
        grid = window.view(b, dilation, phases, c)
        grid[:, :, -1] = 0  # past the last sample: read by no output that is kept, but kept finite
        grid[:, :, :lead] = cur.take().view(b, lead, dilation, c).transpose(1, 2)
        cur.swap(kernels.snake_last(x[:, t - context:], *first))
        kernels.snake_samples(kernels.Samples(x), kernels.Samples(window, dilation, context), b, t, *first)
        y = _conv_output(F.conv2d(_conv_input(window), conv.weight.unsqueeze(2)))  # [b * dilation, phases - lead, C]
        out = torch.empty(b, t, y.shape[-1], dtype=x.dtype, device=x.device)
        return kernels.snake_samples(kernels.Samples(y, dilation), kernels.Samples(out), b, t, *second, bias=conv.bias)

    def _snake(self, x: torch.Tensor, module, tabs: dict) -> torch.Tensor:
        alpha, inv = tabs["snakes"][id(module)]
        kernels = self._fused(x.device)
        if kernels is not None:
            return kernels.snake_last(x, alpha, inv)
        return x + inv * torch.pow(torch.sin(x * alpha), 2)  # upstream's ops, in its order

    def _fused(self, device: torch.device):
        """morph/kernels/snake.py on CUDA where Triton runs, else None."""
        if device.type != "cuda" or self._kernels is False:
            return None
        if self._kernels is None:
            try:
                from ..kernels import snake
            except Exception as e:  # no Triton here: torch's ops, said once
                log.info("morph: the codec runs its activation op by op (%s)", reason(e))
                self._kernels = False
                return None
            self._kernels = snake
        return self._kernels

    def _transformer(self, x: torch.Tensor, pos: torch.Tensor, cur: Cursor) -> torch.Tensor:
        """Upstream's pre-transformer over a chunk, each frame attending to the `window` frames before it."""
        t = self.decoder.pre_transformer
        b, n, _ = x.shape
        positions = pos[:, None] + torch.arange(n, device=x.device)  # [B, n]
        cos, sin = t.rotary_emb(x, positions)
        keys_at = torch.cat((pos[:, None] - self.window + torch.arange(self.window, device=x.device), positions), 1)
        visible = ((keys_at[:, None, :] >= 0) & (keys_at[:, None, :] <= positions[:, :, None])
                   & (keys_at[:, None, :] > positions[:, :, None] - self.window - 1))[:, None]  # [B, 1, n, W + n]
        h = t.input_proj(x)
        for layer in t.layers:
            a = layer.self_attn
            y = layer.input_layernorm(h)
            q, k, v = (p(y).view(b, n, -1, self.head_dim).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
            q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
            keys = torch.cat((cur.take().view(b, self.kv_heads, self.window, -1), k), dim=2)
            cur.swap(keys[:, :, n:].reshape(b, -1, self.head_dim))
            values = torch.cat((cur.take().view(b, self.kv_heads, self.window, -1), v), dim=2)
            cur.swap(values[:, :, n:].reshape(b, -1, self.head_dim))
            o = masked_attention(q, keys, values, visible, a.scaling)
            h = h + layer.self_attn_layer_scale(a.o_proj(o))
            h = h + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(h)))
        return t.output_proj(t.norm(h))


class CapturedDecode:
    """LeanCodec.decode replayed from a graph per call shape, sparing the frame loop's host the live rows' launches."""

    def __init__(self, codec, device: torch.device):
        self.codec, self.device = codec, device
        # on a stream of their own, as they replay beside the frame step's graphs; one warm-up plans cuDNN
        self.graphs = GraphCache(max_graphs=MAX_SHAPES, role=CODEC_CAPTURE, warmup=1)
        # rows -> the state of those rows' graphs, shared by chunk sizes: calls on one stream copy it in and out in turn
        self._states: dict[int, CodecState] = {}

    def bind(self) -> torch.dtype:
        """Drop the graphs and their states as GraphCache.bind drops graphs; returns the weights' dtype."""
        weights = next(self.codec.decoder.parameters())
        self.graphs.bind((self.device, weights.dtype, weights.data_ptr()))
        if not len(self.graphs):
            self._states.clear()
        return weights.dtype

    def decode(self, codes: torch.Tensor, state: CodecState) -> torch.Tensor:
        """LeanCodec.decode(codes, state), the audio a copy that a later replay leaves as it is."""
        entry = self.prepare(*codes.shape[:2])
        if entry is None:
            return self.codec.decode(codes, state)
        static_codes, static_state = entry.keep
        static_codes.copy_(codes)
        static_state.flat.copy_(state.flat)
        static_state.pos.copy_(state.pos)
        wav = entry.replay()
        state.flat.copy_(static_state.flat)
        state.pos.copy_(static_state.pos)
        return wav.clone()

    def prepare(self, rows: int, frames: int):
        """The graph of this call shape, captured on its first call; None for the rest of the batch once one failed."""
        if self.graphs.failed:
            return None
        dtype = self.bind()  # the weights may have moved since the last call (a cast, an offload)
        key = (rows, frames)
        if key in self.graphs:
            return self.graphs.get(key, None)
        groups = int(self.codec.decoder.config.num_quantizers)
        codes = torch.zeros(rows, frames, groups, dtype=torch.long, device=self.device)
        if rows not in self._states:
            self._states[rows] = self.codec.zero_state(rows, self.device, dtype)
        state = self._states[rows]
        # the audio lands in a tensor made outside the capture, or cudaMallocAsync warns at each graph dropped
        audio = torch.empty(rows, frames * self.codec.upsample, dtype=torch.float32, device=self.device)
        entry = self.graphs.get_or_none(key, lambda: audio.copy_(self.codec.decode(codes, state)),
                                        "morph: could not capture the live codec's calls (%s); they run op by op "
                                        "for the rest of this batch, slower to the first audio under load. If this "
                                        "repeats, report it")
        if entry is None:
            self._states.clear()
            return None
        entry.keep = (codes, state)
        return entry
