"""The fused Triton kernels against the lean layers, on CPU through Triton's interpreter.

Run by test_kernels.py in a process of its own with TRITON_INTERPRET=1, which Triton
reads when it is first imported. fp32, so the kernels (IEEE dots, fp32 softmax) and
lean's torch ops may differ only by rounding. tests/gpu checks the compiled kernels.
"""

import os

import pytest
import torch

from morph.decode import lean
from morph.decode.fused_stack import FusedStack
from morph.masked_attention import rotate
from morph.settings import Sampling

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/morph/kernels/test_kernels.py"


@pytest.fixture(scope="module")
def kernels():
    import morph.kernels.layers

    return morph.kernels.layers


def _buffers(stack, batch, length, garbage=0.0):
    d = stack.dims
    shape = (batch, d.kv_heads, length, d.head_dim)
    return [torch.full(shape, garbage) for _ in stack.layers], [torch.full(shape, garbage) for _ in stack.layers]


def test_linear_fuses_norm_silu_and_residual(kernels):
    g = torch.Generator().manual_seed(0)
    w, nw = torch.randn(96, 64, generator=g), torch.randn(64, generator=g)

    def close(got, want):  # fp32 sums in another order: a few units in the sixth digit; a wrong fusion is off by O(1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)

    for rows in (1, 4, 5):  # the kernel up to gemv_rows (4 for this small weight); beyond it, cuBLAS and torch ops
        x, r = torch.randn(rows, 64, generator=g), torch.randn(rows, 48, generator=g)
        close(kernels.linear(x, w, norm_w=nw, eps=1e-6), lean.rms_norm(x, nw, 1e-6) @ w.T)
        gate, up = (x @ w.T).split(48, dim=-1)
        close(kernels.linear(x, w, silu=True), torch.nn.functional.silu(gate) * up)
        close(kernels.linear(x, w[:48], residual=r), r + x @ w[:48].T)
        close(kernels.rms_norm(x, nw, 1e-6), lean.rms_norm(x, nw, 1e-6))


def test_gemv_rows_keeps_the_1_7b_talker_weights_on_cublas_past_two_rows(kernels):
    def rows(n, k):
        return kernels.gemv_rows(torch.empty(n, k, device="meta"))

    assert [rows(4096, 1024), rows(6144, 1024), rows(1024, 3072)] == [4, 4, 4]  # the 0.6B talker's, the predictors'
    assert [rows(4096, 2048), rows(12288, 2048), rows(2048, 6144)] == [2, 2, 2]  # the 1.7B talker's q/k/v, gate/up, down


@pytest.mark.parametrize("top_k", [50, 0, 3000])
def test_pick_draws_what_sampling_pick_draws(top_k):
    """Same generator state, same tokens: the warpers and the race match sampling.pick."""
    from morph.decode import sampling
    from morph.settings import Sampling

    s = Sampling(do_sample=True, temperature=0.7, top_k=top_k)
    scores = torch.randn(3, 2048, generator=torch.Generator().manual_seed(4)) * 3
    scores[1, :100] = -float("inf")  # suppressed tokens, as the talker's rules leave them
    torch.manual_seed(5)
    want = sampling.pick(scores, s)
    from morph.kernels.sampling import sample_warped

    torch.manual_seed(5)
    assert torch.equal(sample_warped(scores, s, sampling.torch_noise), want)


@pytest.mark.parametrize("s", [Sampling(True, 0.7, 50, 0.6), Sampling(True, 1.0, 0, 0.6), Sampling(False)])
def test_fused_pick_draws_what_pick_draws_with_top_p_and_greedy_too(s):
    """The fused kernel has no top-p (no sort), so fused_pick sends a top-p draw, and greedy, op by op
    (top-k, then top-p over what top-k left): same generator state, same tokens as sampling.pick. The draw
    without top-p differs at these seeds, so a fused path that dropped top-p would show."""
    from morph.decode import sampling

    scores = torch.randn(6, 2048, generator=torch.Generator().manual_seed(4)) * 3
    torch.manual_seed(5)
    want = sampling.pick(scores, s)
    torch.manual_seed(5)
    assert torch.equal(sampling.fused_pick(scores, s), want)
    if s.do_sample:
        torch.manual_seed(5)
        assert not torch.equal(sampling.pick(scores, Sampling(True, s.temperature, s.top_k, 1.0)), want)


def test_predictor_passes_match_lean(kernels, tiny_tts):
    """A 2-token prefill, then one token per group, causal over the buffer."""
    model = tiny_tts.tts.model.talker.code_predictor.model
    stack = FusedStack(model.layers, model.norm, model.config)
    d, batch, length = stack.dims, 2, 8
    x = torch.randn(batch, 6, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    cos, sin = lean.rope_tables(model.rotary_emb, length, x.device, x.dtype, multimodal=False)
    lo = torch.zeros(batch, dtype=torch.long)
    ref_k, ref_v = _buffers(stack, batch, length)
    got_k, got_v = _buffers(stack, batch, length)
    for pos in [[0, 1], [2], [3], [4], [5]]:
        idx = torch.tensor(pos)
        rope = idx.unsqueeze(0).expand(batch, -1)
        args = (stack.weights(), model.norm.weight)
        want = lean.stack_step(x[:, pos], *args, ref_k, ref_v, cos, sin, rope, idx, lo, d)
        got = kernels.stack_step(x[:, pos], *args, got_k, got_v, cos, sin, rope, idx, lo, d)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_k + got_v, ref_k + ref_v, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    stack.release()


def test_talker_steps_match_lean_with_left_padding(kernels, tiny_tts):
    """Steps across an attention block boundary over a filled cache; row 1's first 3
    slots are left padding."""
    model = tiny_tts.tts.model.talker.model
    stack = FusedStack(model.layers, model.norm, model.config)
    d, batch, length = stack.dims, 2, 80  # two attention blocks of 64 slots
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, 4, model.config.hidden_size, generator=g)
    cos, sin = lean.rope_tables(model.rotary_emb, length, x.device, x.dtype, multimodal=True)
    pads = torch.tensor([0, 3])
    ref_k, ref_v = _buffers(stack, batch, length)
    for t in ref_k + ref_v:
        t.normal_(generator=g)
    got_k, got_v = [t.clone() for t in ref_k], [t.clone() for t in ref_v]
    for i, pos in enumerate(range(62, 66)):
        slot = torch.tensor([pos])
        rope = slot - pads
        args = (stack.weights(), model.norm.weight)
        want = lean.talker_pass(x[:, i:i + 1], *args, ref_k, ref_v, cos, sin, slot, rope, pads, d)
        got = lean.talker_pass(x[:, i:i + 1], *args, got_k, got_v, cos, sin, slot, rope, pads, d, fused=True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    stack.release()


def test_snake_matches_upstream_snakebeta(monkeypatch):
    """The codec activation against qwen-tts's own module, in fp32. The interpreter has no libdevice,
    so the kernel's sine is tl.sin here (numpy's, an ulp from torch's at times), and its bf16 casts do
    not round as the GPU's do: tests/gpu checks every dtype against the exact function."""
    import triton.language as tl

    from morph.kernels import snake as snake_module
    from morph.qwen.compat import import_qwen_tts
    from morph.kernels.snake import snake

    monkeypatch.setattr(snake_module, "libdevice", tl)

    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import SnakeBeta

    g = torch.Generator().manual_seed(3)
    module = SnakeBeta(48)
    with torch.no_grad():
        module.alpha.copy_(torch.randn(48, generator=g) * 0.5)
        module.beta.copy_(torch.randn(48, generator=g) * 0.5)
    x = torch.randn(2, 48, 1500, generator=g) * 3  # 1500 samples: a second, partial block
    got = snake(x, module)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, module(x), rtol=1e-6, atol=2e-6)


def test_snake_last_is_the_same_activation_channels_last(monkeypatch):
    """The channels-last launch (the lean codec's) against torch's ops on the same tables, a slice included."""
    import triton.language as tl

    from morph.kernels import snake as snake_module
    from morph.kernels.snake import snake_last

    monkeypatch.setattr(snake_module, "libdevice", tl)
    g = torch.Generator().manual_seed(4)
    alpha, inv = torch.rand(48, generator=g) + 0.5, torch.rand(48, generator=g) + 0.5
    x = torch.randn(2, 1500, 48, generator=g) * 3
    for part in (x, x[:, 7:1100]):  # a trimmed transposed convolution's output is such a slice
        torch.testing.assert_close(snake_last(part, alpha, inv), part + inv * torch.sin(part * alpha) ** 2,
                                   rtol=1e-6, atol=2e-6)


def test_snake_samples_moves_samples_between_layouts(monkeypatch):
    """Interleaved 3 ways after 6 samples of context, then read back with a bias: each sample lands where a
    dilation-3 convolution reads it, and what is around it is untouched."""
    import triton.language as tl

    from morph.kernels import snake as snake_module
    from morph.kernels.snake import Samples, snake_samples

    monkeypatch.setattr(snake_module, "libdevice", tl)
    g = torch.Generator().manual_seed(6)
    alpha, inv, bias = (torch.rand(16, generator=g) + 0.5 for _ in range(3))
    x = torch.randn(2, 11, 16, generator=g)
    act = x + inv * torch.sin(x * alpha) ** 2
    window = torch.full((2 * 3, 6, 16), 7.0)  # 2 phases of context, then the 11 samples and one spare slot
    snake_samples(Samples(x), Samples(window, 3, 6), 2, 11, alpha, inv)
    samples = window.view(2, 3, 6, 16).transpose(1, 2).reshape(2, 18, 16)  # back in time order
    torch.testing.assert_close(samples[:, 6:17], act, rtol=1e-6, atol=2e-6)
    assert bool((samples[:, :6] == 7.0).all()) and bool((samples[:, 17] == 7.0).all())
    out = torch.empty(2, 11, 16)
    snake_samples(Samples(window, 3, 6), Samples(out), 2, 11, alpha, inv, bias=bias)
    torch.testing.assert_close(out, (act + bias) + inv * torch.sin((act + bias) * alpha) ** 2, rtol=1e-6, atol=2e-6)


def test_codec_decodes_as_torchs_ops_with_the_units_fused(monkeypatch, tiny_tts):
    """The lean codec's residual units through the kernel's layouts (LeanCodec._unit, what runs on CUDA) against
    torch's ops, chunk by chunk, the last chunk shorter than the widest unit's context: the audio and the state."""
    import triton.language as tl

    from morph.codec.layers import LeanCodec
    from morph.kernels import snake as snake_module

    monkeypatch.setattr(snake_module, "libdevice", tl)
    codec = tiny_tts.codec
    codes = torch.randint(0, codec.codebook_size, (2, 11, 16), generator=torch.Generator().manual_seed(2))

    def decode():
        state = codec.zero_state(2, torch.device("cpu"), torch.float32)
        return torch.cat([codec.decode(piece, state) for piece in codes.split(5, dim=1)], dim=1), state.flat

    want = decode()
    monkeypatch.setattr(LeanCodec, "_fused", lambda self, device: snake_module)
    samples, conv, fused, dilated = snake_module.snake_samples, LeanCodec._conv, [], []
    monkeypatch.setattr(snake_module, "snake_samples", lambda *a, **k: fused.append(1) or samples(*a, **k))
    monkeypatch.setattr(LeanCodec, "_conv", staticmethod(
        lambda x, c, cur: (dilated.append(1) if c.dilation[0] > 1 else None) or conv(x, c, cur)))
    got = decode()
    assert fused and dilated  # both ways ran: the units' kernels, and torch's for the short last chunk
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


# -- paged caches: the same kernel through a page table -----------------------------------------
def _paged(dense: torch.Tensor, lo: torch.Tensor, hi: int, page: int, seed: int):
    """A pool holding the pages of `dense` [B, KVH, L, D] that meet lo[b] .. hi - 1, at scrambled pages with
    spare ones between them, and its table (the same for the same seed). The null page 0, the spare pages and
    every page the table leaves out are NaN, so reading any of them shows in whatever it reaches."""
    batch, kv_heads, length, hd = dense.shape
    used = [(b, p) for b in range(batch) for p in range(length // page) if p * page < hi and (p + 1) * page > lo[b]]
    physical = 1 + torch.randperm(2 * len(used), generator=torch.Generator().manual_seed(seed))[:len(used)]
    pool = torch.full((1 + 2 * len(used), kv_heads, page, hd), float("nan"))
    table = torch.zeros(batch, length // page, dtype=torch.long)
    for (b, p), n in zip(used, physical.tolist(), strict=True):
        table[b, p] = n
        pool[n] = dense[b, :, p * page:(p + 1) * page]
    return pool, table


def _attention_case(t: int, page: int, seed: int):
    """B=3 rows over L=64 slots; new slots 47 (and 48, across a 16-slot page boundary), lo bounds 0, 5 and 37
    (mid-page): row 2's first pages and every row's pages past the last new slot are the null page."""
    d = lean.Dims(heads=4, kv_heads=2, head_dim=16, intermediate=32, eps=1e-6)
    g = torch.Generator().manual_seed(seed)
    batch, length, hd = 3, 64, d.head_dim
    write_idx, lo = torch.tensor([47, 48][:t]), torch.tensor([0, 5, 37])
    dense = [torch.randn(batch, d.kv_heads, length, hd, generator=g) for _ in range(2)]
    (pool_k, table), (pool_v, _) = (_paged(c, lo, t + 47, page, seed) for c in dense)
    allocated = table[table > 0]
    assert (table == 0).any() and not torch.equal(allocated.sort().values, allocated)  # null pages; scrambled
    args = dict(qkv=torch.randn(batch * t, (d.heads + 2 * d.kv_heads) * hd, generator=g),
                q_norm=torch.randn(hd, generator=g), k_norm=torch.randn(hd, generator=g),
                cos_table=torch.randn(length, hd, generator=g), sin_table=torch.randn(length, hd, generator=g),
                rope_pos=write_idx.unsqueeze(0) - lo.unsqueeze(1), write_idx=write_idx, lo=lo, d=d)
    return args, dense, [pool_k, pool_v], table


@pytest.mark.parametrize("t", [1, 2])
def test_attention_is_the_torch_attention_over_the_written_cache(kernels, t):
    """The kernel against morph/masked_attention.py (the pack's one torch attention) after the new tokens' keys and
    values, normed and rotated in torch, are written at their slots: the output and the caches to fp32 rounding."""
    from morph.kernels.attention import attention
    from morph.masked_attention import masked_attention

    args, (k_cache, v_cache), _, _ = _attention_case(t, 16, seed=7)
    d, b, idx, lo = args["d"], 3, args["write_idx"], args["lo"]
    q, k, v = args["qkv"].view(b, t, -1).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
    cos, sin = (args[n][args["rope_pos"]].unsqueeze(1) for n in ("cos_table", "sin_table"))

    def heads(x, n, norm):
        return rotate(lean.rms_norm(x.reshape(b, t, n, d.head_dim), norm, d.eps).transpose(1, 2), cos, sin)

    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[:, :, idx] = heads(k, d.kv_heads, args["k_norm"])
    want_v[:, :, idx] = v.reshape(b, t, d.kv_heads, d.head_dim).transpose(1, 2)
    slots = torch.arange(k_cache.shape[2])
    allowed = ((slots <= idx[:, None]) & (slots >= lo[:, None, None])).unsqueeze(1)  # [B, 1, T, L]
    want = masked_attention(heads(q, d.heads, args["q_norm"]), want_k, want_v, allowed, d.scale)
    got = attention(k_cache=k_cache, v_cache=v_cache, **args)
    torch.testing.assert_close(got, want.reshape(b * t, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache, want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_cache, want_v, rtol=0, atol=0)


@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("t", [1, 2])
def test_paged_attention_gives_the_dense_output(kernels, t, page):
    """Same keys and values behind a scrambled table: the dense kernel's output to fp32 rounding (the tiles
    differ), so no NaN page outside lo .. the last new slot was read."""
    from morph.kernels.attention import attention

    args, (dense_k, dense_v), (pool_k, pool_v), table = _attention_case(t, page, seed=0)
    want = attention(k_cache=dense_k, v_cache=dense_v, **args)
    got = attention(k_cache=pool_k, v_cache=pool_v, table=table, **args)
    assert want.isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_paged_attention_gathers_tiles_wider_than_a_page(kernels, monkeypatch):
    """A 64-slot tile over 16-slot pages, one tile of several over the cache (the launcher's 128-slot tiles
    cover these 64 slots in one): each slot through its own page, and the null pages in the tile, below lo
    and past the new slots, are masked, not loaded: NaN values times a zero weight would still be NaN."""
    from morph.kernels import attention as module

    args, (dense_k, dense_v), (pool_k, pool_v), table = _attention_case(2, 16, seed=4)
    want = module.attention(k_cache=dense_k, v_cache=dense_v, **args)
    monkeypatch.setattr(module, "_tiles", lambda length: (64, 4))
    got = module.attention(k_cache=pool_k, v_cache=pool_v, table=table, **args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [False, True])
def test_a_dense_row_reads_nothing_below_its_bound_and_a_row_that_sees_no_slot_gets_zeros(kernels, monkeypatch,
                                                                                         splits):
    """NaN below a row's bound (what a free slot stepping past its last row's bound wrote into that row's cache)
    stays out of its output, in one pass or split; a row whose bound is past its slot (such a free slot) gets 0,
    not 0 / 0 = NaN, which made the step's pick for it an index past the vocabulary."""
    from morph.kernels import attention as module

    args, (dense_k, dense_v), _, _ = _attention_case(1, 16, seed=6)
    monkeypatch.setattr(module, "_tiles", lambda length: (16, 4))
    if not splits:
        monkeypatch.setattr(module, "_splits", lambda programs, tiles: 1)
    want = module.attention(k_cache=dense_k.clone(), v_cache=dense_v.clone(), **args)
    poisoned = [c.clone() for c in (dense_k, dense_v)]
    for c in poisoned:
        c[1, :, :5] = float("nan")  # row 1's bound is 5, row 2's 37 (mid-tile)
        c[2, :, 32:37] = float("nan")
    got = module.attention(k_cache=poisoned[0], v_cache=poisoned[1], **args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    args["lo"] = torch.tensor([0, 5, 60])  # row 2's bound past its slot, 47
    got = module.attention(k_cache=dense_k.clone(), v_cache=dense_v.clone(), **args)
    rows = got.view(3, -1)
    assert rows.isfinite().all() and not rows[2].any()
    torch.testing.assert_close(rows[:2], want.view(3, -1)[:2], rtol=0, atol=0)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("t", [1, 2])
def test_split_cache_gives_the_one_pass_output(kernels, monkeypatch, t, paged):
    """16-slot tiles over the 64 slots make 4 tiles, and the launcher runs each (row, kv head) in 4 splits: the
    output of one pass over the tiles to fp32 rounding. With t=2 the new slots 47 and 48 fall in two splits' tiles,
    and row 2 (lo 37) leaves split 0 and 1 no slot but their own: their partial softmax must weigh nothing. The
    new K/V land where one pass writes them, each written by the split that reads it."""
    from morph.kernels import attention as module

    args, dense, pools, table = _attention_case(t, 16, seed=5)
    caches = dict(k_cache=pools[0], v_cache=pools[1], table=table) if paged else \
        dict(k_cache=dense[0], v_cache=dense[1])
    before = [c.clone() for c in caches.values() if c is not table]
    monkeypatch.setattr(module, "_tiles", lambda length: (16, 4))
    assert module._splits(3 * args["d"].kv_heads, 4) == 4
    got = module.attention(**caches, **args)
    written = [c.clone() for c in caches.values() if c is not table]
    for c, b in zip((v for v in caches.values() if v is not table), before, strict=True):
        c.copy_(b)
    monkeypatch.setattr(module, "_splits", lambda programs, tiles: 1)
    want = module.attention(**caches, **args)
    assert want.isfinite().all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(written, (c for c in caches.values() if c is not table), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("t", [1, 2])
def test_paged_attention_writes_the_new_tokens_where_the_table_says(kernels, t):
    """The new K/V (the dense kernel's, exactly) land in pool[table[b, s // PAGE], :, s % PAGE], and nothing
    else in the pool changes."""
    from morph.kernels.attention import attention

    page = 16
    args, dense, pools, table = _attention_case(t, page, seed=1)
    want = [p.clone() for p in pools]
    attention(k_cache=dense[0], v_cache=dense[1], **args)
    attention(k_cache=pools[0], v_cache=pools[1], table=table, **args)
    for s in args["write_idx"].tolist():
        for b in range(table.shape[0]):
            for w, c in zip(want, dense, strict=True):
                w[table[b, s // page], :, s % page] = c[b, :, s]
    for got, w, before in zip(pools, want, _attention_case(t, page, seed=1)[2], strict=True):
        assert not torch.equal(w.nan_to_num(), before.nan_to_num())  # the new K/V differ from the old
        torch.testing.assert_close(got, w, rtol=0, atol=0, equal_nan=True)


def test_paged_stack_step_gives_the_dense_stack_step(kernels):
    """Two layers, each with its own pools under the one table: the dense stack's output, and each layer's
    slots lo[b] .. 48 (its new K/V among them) where the table says, to rounding."""
    page = 16
    args, _, _, table = _attention_case(2, page, seed=2)
    d, g, hidden = args["d"], torch.Generator().manual_seed(3), 32
    shapes = [(hidden,), ((d.heads + 2 * d.kv_heads) * d.head_dim, hidden), (d.head_dim,), (d.head_dim,),
              (hidden, d.q_size), (hidden,), (2 * d.intermediate, hidden), (hidden, d.intermediate)]
    weights = [lean.LayerW(*(torch.randn(*s, generator=g) * (1 if len(s) == 1 else 0.2) for s in shapes))
               for _ in range(2)]
    dense = [torch.randn(3, d.kv_heads, 64, d.head_dim, generator=g) for _ in range(4)]
    paged = [_paged(c, args["lo"], 49, page, seed=2) for c in dense]
    assert all(torch.equal(t, table) for _, t in paged)
    pools = [p for p, _ in paged]
    x, norm_w = torch.randn(3, 2, hidden, generator=g), torch.randn(hidden, generator=g)
    rest = [args[k] for k in ("cos_table", "sin_table", "rope_pos", "write_idx", "lo", "d")]
    want = kernels.stack_step(x, weights, norm_w, dense[:2], dense[2:], *rest)
    got = kernels.stack_step(x, weights, norm_w, pools[:2], pools[2:], *rest, table=table)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for pool, c in zip(pools, dense, strict=True):
        for b, lo in enumerate(args["lo"].tolist()):
            s = torch.arange(lo, 49)
            torch.testing.assert_close(pool[table[b, s // page], :, s % page], c[b, :, s].transpose(0, 1),
                                       rtol=1e-5, atol=1e-5)
