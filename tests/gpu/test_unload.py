"""Moving the model off the GPU (what "Unload models" does) leaves nothing of it there."""

import gc

import torch

from morph.settings import GenerationSettings


def test_moving_off_the_gpu_leaves_no_tensor_of_the_model_there(cuda_tts, voices, ref_wave):
    cuda_tts.make_voice(ref_wave, 24000, transcript="A short reference sentence.")  # the encoder caches codebooks
    cuda_tts.clone("Captured, then moved off.", voices["xvector"], "English",
                   GenerationSettings(seq_groups=5, seed=1, max_new_tokens=12))
    cuda_tts.to("cpu")
    cuda_tts.release_device_state()
    try:
        left = []
        for root in (cuda_tts.tts.model, cuda_tts.tts.model.speech_tokenizer.model):
            left += [name for name, t in (*root.named_parameters(), *root.named_buffers()) if t.is_cuda]
            left += [f"{type(m).__name__}.{name}" for m in root.modules() for name, value in vars(m).items()
                     if torch.is_tensor(value) and value.is_cuda]
        assert not left
    finally:
        cuda_tts.to("cuda")


def test_another_loaded_model_leaves_no_more_memory_after_its_unload(cuda_tts, tiny_dir, voices):
    """What each render's streams keep for the process (cuBLAS's workspace per stream it has seen) is kept once: a
    second model loaded, rendered with and released leaves allocated memory where the first left it (a stream per
    model left 33 MiB a model in ComfyUI)."""
    from morph.api import MorphTTS

    settings = GenerationSettings(seq_groups=5, seed=1, max_new_tokens=20)
    cuda_tts.clone("One model, rendered once.", voices["xvector"], "English", settings)
    cuda_tts.release_device_state()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    other = MorphTTS.load(str(tiny_dir), device="cuda", dtype="fp32")
    other.clone("Another model, rendered once.", voices["xvector"], "English", settings)
    other.to("cpu")
    other.release_device_state()
    del other
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 2**20
