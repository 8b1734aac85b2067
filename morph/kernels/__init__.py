"""Triton kernels and their launchers; each imports Triton, so morph/decode/ imports them only where fused modes run."""
