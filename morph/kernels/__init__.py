"""Triton kernels and their launchers; they import only torch, Triton and each other. Importing a module here
imports Triton, so morph/decode/ imports them where a fused mode runs, never at load."""
