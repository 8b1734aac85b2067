"""The fused codec activation matches qwen-tts's SnakeBeta on the GPU to rounding (no further from the
exact function than upstream's own ops), alone and in a whole codec decode."""

import pytest
import torch

from morph.render import BatchTTS, Line
from morph.qwen.compat import import_qwen_tts
from morph.settings import GenerationSettings
from tests.audio_compare import assert_audio_close


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_equal_to_upstream_module(dtype):
    from morph.kernels.snake import snake

    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import SnakeBeta

    g = torch.Generator(device="cuda").manual_seed(5)
    module = SnakeBeta(96).cuda()
    with torch.no_grad():
        module.alpha.normal_(0, 0.7, generator=g)
        module.beta.normal_(0, 0.7, generator=g)
    module.to(dtype)
    for shape in ((1, 96, 7), (3, 96, 4000)):
        x = (torch.randn(*shape, device="cuda", generator=g) * 4).to(dtype)
        got, want = snake(x, module), module(x).detach()
        # against the same formula in fp64: the kernel is as accurate as upstream's own ops
        a, b, xd = module.alpha.double().exp()[:, None], module.beta.double().exp()[:, None], x.double()
        exact = xd + 1.0 / (b + 1e-9) * torch.sin(xd * a) ** 2
        err, upstream_err = (got.double() - exact).abs().max(), (want.double() - exact).abs().max()
        assert err <= 1.5 * upstream_err, (dtype, shape, err.item(), upstream_err.item())


def test_codec_decode_is_unchanged_by_the_patch(cuda_tts, voices):
    batch = BatchTTS(cuda_tts)
    assert cuda_tts.patch.snakes and all("forward" in vars(m) for m in cuda_tts.patch.snakes)
    codes = batch.codes([Line("Hello there.", voices["xvector"], "English")],
                        GenerationSettings(seq_groups=5, seed=3, max_new_tokens=12))
    for dtype in (torch.float32, torch.bfloat16):
        codec = cuda_tts.tts.model.speech_tokenizer.model
        codec.to(dtype)
        try:
            fused = batch.decode(codes, [voices["xvector"]])[0]
            saved = {m: vars(m).pop("forward") for m in cuda_tts.patch.snakes}
            plain = batch.decode(codes, [voices["xvector"]])[0]
            for m, f in saved.items():
                m.forward = f
        finally:
            codec.to(torch.float32)
        assert fused.size, dtype
        assert_audio_close(fused, plain, rel=1e-2 if dtype == torch.bfloat16 else 1e-5)
