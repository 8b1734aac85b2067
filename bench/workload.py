"""What every bench speaks, and how it reads the device: the fixed line and reference voice, EOS held
back so random weights speak a set number of frames, and the device's sync and peak memory."""

from __future__ import annotations

import contextlib
import resource

import torch

from morph.engine import MorphTTS

TEXT = ("The river ran quietly past the old mill, and the children counted the boats until the sun went down "
        "behind the hills, then walked home along the towpath, telling stories about the people on board.")
REF_TEXT = "The quick brown fox jumps over the lazy dog."


@contextlib.contextmanager
def eos_held_back(talker):
    """Random weights emit EOS at random steps; a fixed-length run needs none: a hook on upstream's codec_head."""
    eos = talker.config.codec_eos_token_id

    def no_eos(module, args, out):
        out[..., eos] = -float("inf")
        return out

    handle = talker.codec_head.register_forward_hook(no_eos)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def eos_suppressed(tts: MorphTTS, frames: int):
    """No EOS for `frames` frames, whichever decode runs: upstream's talker through eos_held_back, while the
    morph loop holds EOS back itself."""
    loop = tts.patch.loop
    loop.min_new_tokens = frames + 2
    try:
        with eos_held_back(tts.tts.model.talker):
            yield
    finally:
        loop.min_new_tokens = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS on CPU
