"""What every bench speaks, and how it reads the device: the fixed line and reference voice, EOS held
back so random weights speak a set number of frames, the engine's parts timed as they are called (timed_calls), and
the device's sync and peak memory.

A render's memory on CUDA is read two ways: what the process took of the device (taken_bytes: torch's reserve and
CUDA's graph pool), which morph/memory.py declares, and torch's allocated peak plus what the CUDA graphs held as the
render began (graph_bytes), which leaves the allocator's reserve out."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import functools
import resource
import sys
import time
from typing import Callable, Iterable

import torch

from morph.settings import GenerationSettings

TEXT = ("The river ran quietly past the old mill, and the children counted the boats until the sun went down "
        "behind the hills, then walked home along the towpath, telling stories about the people on board.")
REF_TEXT = "The quick brown fox jumps over the lazy dog."


def eos_held(settings: GenerationSettings, frames: int) -> GenerationSettings:
    """`settings` with no EOS for `frames` frames: random weights emit EOS at random steps, so a run of set length
    holds it back past each row's own frame limit (up to `frames`); upstream's own talker takes eos_held_back."""
    return dataclasses.replace(settings, min_new_tokens=frames + 2)


@contextlib.contextmanager
def eos_held_back(talker):
    """No EOS from upstream's own talker (the bench's "upstream" stack): a hook on its codec_head."""
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
def timed_calls(targets: Iterable[tuple[object, str, str]], around: Callable[[], None] | None = None):
    """Each (owner, attribute, label) of `targets` (a module's function, a class's method, an object's bound method)
    wrapped so that its calls add their wall seconds to the yielded Counter's [label], `around()` run before and after
    each call (a device sync charges a call its GPU time); all put back after, in reverse."""
    spent, saved = collections.Counter(), []
    for owner, name, label in targets:
        fn = getattr(owner, name)
        saved.append((owner, name, fn, name in vars(owner)))

        def timed(*args, _fn=fn, _label=label, **kw):
            if around is not None:
                around()
            start = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                if around is not None:
                    around()
                spent[_label] += time.perf_counter() - start
        setattr(owner, name, functools.wraps(fn)(timed))
    try:
        yield spent
    finally:
        for owner, name, fn, own in reversed(saved):
            if own:
                setattr(owner, name, fn)
            else:  # an inherited method or an object's own bound method: the wrapper shadowed it
                delattr(owner, name)


class StepClock:
    """A render's `on_step(done, total)` (morph/progress.py: before every step, `done` grown by the step's live rows)
    timed on the host: ms a frame at each live-row count, the median gap between a step and the next. The host runs a
    few frames ahead of the GPU and waits on it from then on, so a long run of frames at one count paces at the GPU's
    frame time there: how a lone row in a wide batch compares with the same line alone."""

    def __init__(self):
        self.steps: list[tuple[float, int]] = []  # (when, live rows) of each report
        self.done = 0  # the last report's

    def __call__(self, done: int, total: int) -> None:
        self.steps.append((time.perf_counter(), done - self.done))
        self.done = done

    def ms_per_frame(self, least: int = 32) -> dict[str, list]:
        """{live rows: [frames, median ms a frame]} for each count seen at `least` steps or more (a render's last
        report, `total` at its end, counts once, and never that often)."""
        gaps = collections.defaultdict(list)
        for (when, live), (after, _) in zip(self.steps, self.steps[1:]):
            gaps[live].append(after - when)
        return {str(live): [len(g), round(1000 * sorted(g)[len(g) // 2], 3)]
                for live, g in sorted(gaps.items()) if len(g) >= least}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# How far runs of the same renders apart read taken_bytes' peak under cudaMallocAsync: up to 0.50 GiB at 1 to 64 rows
# of 5 s lines (ICL at 8 rows: 1.03, 1.09 and 0.59 GiB in three calls; H200, bench/results/h200-2026-11-28c and
# h200-2026-11-28d NOTES.md), where the native allocator's read the same to 0.04 GiB. A render's peak may read this
# much under another run's of it, so a declaration is held to its peak with this much added.
ASYNC_TAKEN_SPREAD = int(0.5 * 2**30)


def taken_bytes(device: torch.device, peak: bool = False) -> int:
    """What this process has taken of a CUDA device, now or at torch's peak (`peak`): torch's reserved memory (under
    the native allocator the graphs' private pools are in it) and, under cudaMallocAsync, CUDA's graph memory pool
    (graph_bytes, which does not shrink between trims). Near the driver's own count, a little under it (the 0.6B
    script at 64: 4.59 against 4.72 GiB under cudaMallocAsync, 5.06 against 5.26 native; H200,
    bench/results/h200x4-2026-11-28c/NOTES.md). What morph/memory.py declares is measured against this
    (tests/gpu/test_memory.py): a card has that much less for anything else."""
    reserved = torch.cuda.max_memory_reserved(device) if peak else torch.cuda.memory_reserved(device)
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        reserved += graph_bytes(device)
    return reserved


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS on CPU


CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2  # the driver API's CUgraphMem_attribute


def graph_bytes(device: torch.device) -> int:
    """What captured CUDA graphs hold on `device` that torch.cuda.memory_allocated does not count: under
    cudaMallocAsync CUDA's graph memory pool (captures allocate there, and it keeps what they took), under the native
    allocator the free blocks of torch's private pools (the graphs' own: a replay uses them, the counter sees only the
    blocks their capture left in use). 0 off CUDA."""
    if device.type != "cuda":
        return 0
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        value = ctypes.c_uint64()
        index = device.index if device.index is not None else torch.cuda.current_device()
        status = driver.cuDeviceGetGraphMemAttribute(index, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                                                     ctypes.byref(value))
        if status != 0:
            raise RuntimeError(f"cuDeviceGetGraphMemAttribute failed with CUDA error {status}")
        return value.value
    return sum(segment["total_size"] - segment["allocated_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment["segment_pool_id"]) != (0, 0))
