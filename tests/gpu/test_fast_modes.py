"""graphs and fused give the op-by-op (lean) codes in fp32 on the GPU, through the public API, in static batches (the
continuous batch's own: tests/gpu/test_continuous.py)."""

import pytest
import torch

from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling

TEXTS = ["The first line, and the longest of the four in this batch.", "A short one.", "Number three here.",
         "And the fourth."]


def settings(k: int, sampled: bool) -> GenerationSettings:
    return GenerationSettings(seq_groups=k, do_sample=sampled, subtalker=Sampling(do_sample=sampled), seed=7,
                              max_new_tokens=24)


def codes(tts, mode: str, k: int, sampled: bool, voice, batch: int) -> list[torch.Tensor]:
    tts.patch.mode = mode
    try:
        lines = [Line(text, voice, "English") for text in TEXTS[:batch]]
        return [c.cpu() for c in BatchTTS(tts).codes(lines, settings(k, sampled), continuous=False)]
    finally:
        tts.patch.mode = "auto"


@pytest.mark.parametrize("mode", ["graphs", "fused"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("prompt", ["xvector", "icl"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [15, 5])
def test_fast_mode_equals_op_by_op(cuda_tts, voices, mode, batch, prompt, sampled, k):
    fast = codes(cuda_tts, mode, k, sampled, voices[prompt], batch)
    assert cuda_tts.patch.last_run["mode"] == mode
    lean = codes(cuda_tts, "lean", k, sampled, voices[prompt], batch)
    assert len(fast) == batch and all(c.shape[0] > 3 for c in fast)
    assert all(torch.equal(a, b) for a, b in zip(fast, lean, strict=True))


def test_the_allocator_backend_is_the_one_asked_for():
    import os

    asked = "cudaMallocAsync" if "cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else "native"
    assert torch.cuda.get_allocator_backend() == asked
