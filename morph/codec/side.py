"""Work on the codec's own CUDA stream beside the frame loop (LeanCodec.side_stream), for the rows decoded whole or
by chunks (stream.py) and those decoded while they are made (live.py): run there, take the frame loop's tensors
there, and start the audio's copy to the host from there. Off CUDA (`stream` None) each does its work in line."""

from __future__ import annotations

import contextlib

import torch


def on_side(stream: "torch.cuda.Stream | None"):
    """A context that runs its work on `stream`."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def take(stream: "torch.cuda.Stream | None", device, *tensors: torch.Tensor) -> None:
    """Tensors made on the caller's (the frame loop's) stream, read on the codec's: it waits for them, and the
    allocator keeps them until it has."""
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(device))
        for t in tensors:
            t.record_stream(stream)


def to_host(parts: list[torch.Tensor], stream: "torch.cuda.Stream | None", device) -> tuple:
    """Start the copy of `parts`, joined, to the host (on the codec's stream): (event or None, host tensor, the
    joined tensor on the device, kept with them until the copy is read)."""
    flat = torch.cat(parts) if parts else torch.zeros(0, device=device)
    host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=stream is not None)
    host.copy_(flat, non_blocking=stream is not None)
    event = None
    if stream is not None:
        event = torch.cuda.Event()
        event.record(stream)
    return event, host, flat
