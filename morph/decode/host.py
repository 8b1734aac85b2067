"""Small index tensors the host hands the GPU between frames, without waiting for its queue.

`torch.tensor(values, device=cuda)` copies from pageable memory only once the stream's queued work has finished, so
each join of the continuous batch would wait for the frames queued ahead while the GPU idles (most of a join's host
time: bench/results/h100-2026-11-25e/NOTES.md). From pinned memory the copy is queued behind those frames like a
kernel, and torch's pinned-memory cache keeps the buffer until the copy has run.
"""

from __future__ import annotations

import torch


def to_device(values, device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (a list of numbers) as a tensor on `device`, copied without waiting for the device's queue."""
    cuda = torch.device(device).type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=cuda).to(device, non_blocking=cuda)
