"""The exact reference, eager mode: upstream's batched generate with the reference loop as its talker.generate,
bit-identical to upstream at seq_groups 15 in fp32 on the CPU (tests/morph/test_exactness.py)."""
