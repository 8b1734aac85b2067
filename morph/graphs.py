"""CUDA graphs for the decode step: capture once per key, replay many times.

A step is captured the first time its key (seq_groups, batch, capacity, dtype, sampling, ...) is asked for. What a
replay reads or writes between frames lives in buffers allocated outside the capture, so a graph takes only scratch
from its pool; all graphs of one model share one pool, and a bounded LRU keeps their number down when seq_groups or the
batch size changes. A change of device, dtype or weight storage drops them all.

Both CUDA allocators are supported, as ComfyUI picks one for the whole process (cudaMallocAsync by default, the native
one with --disable-cuda-malloc). Under cudaMallocAsync, memory allocated during a capture is a node of the graph with
no physical backing until the graph runs, so (here and in morph/kernels/kth.py):
- kernel launchers that check their pointer arguments (Triton's) refuse it: our own kernels take addresses;
- freeing it after a failed capture aborts the process inside the allocator, so a failed capture's graph and all its
  frames hold are kept for the life of the process (`_keep_forever`): address space only, no memory.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import logging
import sys
import threading
from typing import Callable

import torch

from .errors import reason

log = logging.getLogger(__name__)


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


class CapturedStep:
    """One captured graph and the outputs its capture returned (static tensors)."""

    def __init__(self, graph, outputs):
        self.graph = graph
        self.outputs = outputs
        self.keep = None  # the buffers the graph reads and writes, kept alive as long as the graph

    def replay(self):
        self.graph.replay()
        return self.outputs


# The roles of the pack's streams (side_stream; what runs on each: docs/architecture.md, Threads and CUDA streams)
CAPTURE, CODEC, CODEC_CAPTURE, FRAME_LOOP, PROMPTS = "capture", "codec", "codec capture", "frame loop", "prompts"


class GraphCache:
    """An LRU of captured steps sharing one memory pool, captured on the side stream of `role` (capture says why a
    cache whose graphs replay beside another's needs a role of its own) after `warmup` runs."""

    def __init__(self, max_graphs: int = 4, role: str = CAPTURE, warmup: int = 2):
        self.max_graphs, self.role, self.warmup = max_graphs, role, warmup
        self._graphs: collections.OrderedDict = collections.OrderedDict()
        self._pool = None
        self._owner = None  # (device, dtype, weights fingerprint) the graphs were captured against
        self.failed = False  # a capture failed since the cache was last bound: its owner runs op by op

    def __len__(self) -> int:
        return len(self._graphs)

    def __contains__(self, key) -> bool:
        return key in self._graphs

    def bind(self, owner) -> None:
        """At a run's start: drop every graph if the device, dtype or weight storage changed since capture, or if a
        capture failed since the last bind (get_or_none), so that this run tries again."""
        if owner != self._owner:
            self.clear()
            self._owner = owner

    def get(self, key, step: Callable[[], object]) -> CapturedStep:
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        entry = capture(step, self._pool, warmup=self.warmup, role=self.role)
        self._graphs[key] = entry
        return entry

    def get_or_none(self, key, step: Callable[[], object], failure: str) -> CapturedStep | None:
        """get(key, step), or None when a capture fails for any reason other than memory (every run's captures share
        this policy): logged as `failure` % its reason, and every key gives None until the next run binds the cache
        again. A CUDA out-of-memory error clears the cache and is raised as it is, for the caller's out-of-memory
        handling."""
        if self.failed:
            return None
        try:
            return self.get(key, step)
        except torch.cuda.OutOfMemoryError:
            self.clear()
            raise
        except Exception as e:
            self.clear()  # unbound as well: the next bind, at the next run's start, clears `failed`
            self.failed = True
            log.warning(failure, reason(e))
            return None

    def drop(self) -> None:
        """Forget every graph and their pool, staying bound to the same owner (their inputs moved, not the weights)."""
        self._graphs.clear()
        self._pool = None

    def clear(self) -> None:
        self.drop()
        self._owner = None
        self.failed = False


@contextlib.contextmanager
def _rng_preserved(device: torch.device):
    """Warm-up and capture run the step, which draws random numbers: put the generator
    back so the user's seeded stream is the same whether a capture happened or not."""
    state = torch.cuda.get_rng_state(device)
    try:
        yield
    finally:
        torch.cuda.set_rng_state(state, device)


_STREAMS: dict = {}


def side_stream(device, role: str) -> torch.cuda.Stream:
    """The pack's one stream per device for `role` (one of the roles above), for the life of the process: cuBLAS keeps
    a workspace (32 MiB on Hopper) per stream it has seen and no API frees it, so a new stream per capture, per render
    or per loaded model leaks one each, which Unload Models in ComfyUI cannot give back."""
    key = _stream_key(device, role)
    if key not in _STREAMS:
        priority = torch.cuda.Stream.priority_range()[1] if role == FRAME_LOOP else 0
        _STREAMS[key] = torch.cuda.Stream(key[0], priority=priority)
    return _STREAMS[key]


def side_stream_made(device, role: str) -> bool:
    """Whether this process has made the stream of `role` on `device`: its cuBLAS workspace is then taken already."""
    return torch.device(device).type == "cuda" and _stream_key(device, role) in _STREAMS


def _stream_key(device, role: str) -> tuple:
    device = torch.device(device)
    if device.index is None:  # "cuda" and "cuda:0" are one device: one stream
        device = torch.device("cuda", torch.cuda.current_device())
    return device, role


@contextlib.contextmanager
def frame_loop_stream(device: torch.device):
    """Run the continuous batch's frame loop on the pack's "frame loop" stream, of the device's highest priority, after
    the caller's stream's work and before its next: the codec's calls fill the GPU with large kernels, behind whose
    blocks the frame step's small ones would queue at equal priority (bench/results/h100-2026-11-26h/NOTES.md). Off
    CUDA it runs where it is."""
    if device.type != "cuda":
        yield
        return
    stream, caller = side_stream(device, FRAME_LOOP), torch.cuda.current_stream(device)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        caller.wait_stream(stream)


# Held by every capture, and by the pack's GPU work on other threads (morph/engine/runner.py), so that the two never
# overlap: while a stream captures, CUDA forbids other threads' syncs and allocations (torch's default capture mode)
CAPTURE_LOCK = threading.Lock()

_FAILED_CAPTURES: list = []
# The list itself must outlive interpreter shutdown too, when module globals are cleared.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_FAILED_CAPTURES))


def _keep_forever(*objects) -> None:
    """See the module docstring: under cudaMallocAsync, what a failed capture allocated
    must never be freed."""
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        _FAILED_CAPTURES.append(objects)


@contextlib.contextmanager
def _collector_paused():
    """No automatic garbage collection inside: garbage that holds a graph of the pool being captured into (a batch
    left in a reference cycle by an exception, say) freed in the middle of the capture aborts the process, and torch
    does not collect on entry. Collecting before each capture instead would take a fraction of a second each with a
    model loaded, and a continuous render captures tens of graphs as it starts. The switch is the process's: it is put
    back as it was found."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def capture(step: Callable[[], object], pool=None, warmup: int = 2, role: str = CAPTURE) -> CapturedStep:
    """Warm `step` up on the side stream of `role` (Triton's kernel builds, cuBLAS handles), then capture it there.

    A graph keeps the cuBLAS workspace of the stream it was captured on, so graphs that replay at the same time on two
    streams must be captured on two: the codec's, sharing the frame step's workspace, would now and then change a
    row's codes (tests/gpu/test_streaming.py).

    The warm-up runs the exact call the capture records, so what can fail outside a capture (a kernel that does not
    build, an unsupported layer) fails before any capture has allocated memory. The step runs for real `warmup` times
    and once more replayed: a caller captures before its buffers hold anything it keeps.
    """
    device = torch.device("cuda", torch.cuda.current_device())
    side = side_stream(device, role)
    with _rng_preserved(device):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with CAPTURE_LOCK, _collector_paused(), torch.cuda.graph(graph, pool=pool, stream=side):
                outputs = step()
        except BaseException as e:
            _keep_forever(graph, e, e.__traceback__)
            raise
        # Run once now, as the warm-up ran: under cudaMallocAsync what a capture allocates is backed only once the
        # graph has run, and freeing a never-run graph's memory aborts the process. A continuous batch captures a
        # step per width up front (morph/engine/batch.py) and a render may never run some of them.
        graph.replay()
        torch.cuda.synchronize()
    return CapturedStep(graph, outputs)


def trim_graph_memory() -> None:
    """Give the memory of destroyed graphs back to the device.

    Under cudaMallocAsync, what a capture allocates lives in CUDA's graph memory pool, kept after the graph is destroyed
    until the pool is trimmed (torch.cuda.empty_cache trims only the allocator's own pool). The trim releases only
    memory no live graph uses, so other packs' graphs keep theirs. Under the native allocator graph memory is in
    torch's pools, which empty_cache releases.
    """
    if not torch.cuda.is_initialized() or torch.cuda.get_allocator_backend() != "cudaMallocAsync":
        return
    try:
        driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    except OSError:  # no driver library under that name: nothing to trim through it
        return
    torch.cuda.synchronize()
    for index in range(torch.cuda.device_count()):
        driver.cuDeviceGraphMemTrim(index)
