"""Triton kernels and their launchers. Importing one imports Triton, so morph/decode/ imports them only where a fused
mode runs."""
