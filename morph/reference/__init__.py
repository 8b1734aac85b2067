"""The exact reference, eager mode: upstream's batched generate with the reference loop in place of its talker.generate
(`patch.py`, the seam; `loop.py`, the loop on the checkpoint's own HF layers), bit-identical to upstream qwen-tts at
seq_groups 15 in fp32 on the CPU (tests/morph/test_exactness.py). The continuous batch never imports it."""
