"""CUDA graphs: capture once per key, replay many times. What a replay reads or writes between frames lives in buffers
allocated outside the capture, so a graph takes only scratch from its cache's one pool. Under cudaMallocAsync a
capture's memory has no backing until the graph runs, which Triton's pointer checks refuse (so our kernels take
addresses), and freeing it after a failed capture aborts the process (`_keep_forever` keeps it)."""

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
        self.graph, self.outputs = graph, outputs
        self.keep = None  # the buffers the graph reads and writes, kept alive as long as the graph

    def replay(self):
        self.graph.replay()
        return self.outputs


# The roles of the pack's streams (side_stream; what runs on each: docs/architecture.md, Threads and CUDA streams)
CAPTURE, CODEC, CODEC_CAPTURE, FRAME_LOOP, PROMPTS = "capture", "codec", "codec capture", "frame loop", "prompts"


class GraphCache:
    """An LRU of captured steps sharing one memory pool, captured on the side stream of `role` after `warmup` runs."""

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
        """At a run's start: drop every graph if the device, dtype or weights changed, or a capture failed since."""
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
        """get(key, step), or None when a capture fails other than for memory: logged as `failure` % its reason, and
        every key None until the next bind. Out of memory clears the cache and is raised."""
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
    """Put the generator back after warm-up and capture, so a seeded stream is the same whether a capture happened."""
    state = torch.cuda.get_rng_state(device)
    try:
        yield
    finally:
        torch.cuda.set_rng_state(state, device)


_STREAMS: dict = {}


def side_stream(device, role: str) -> torch.cuda.Stream:
    """The pack's one stream per device and `role`, kept for good: cuBLAS keeps a workspace per stream, never freed."""
    key = _stream_key(device, role)
    if key not in _STREAMS:
        priority = torch.cuda.Stream.priority_range()[1] if role == FRAME_LOOP else 0
        _STREAMS[key] = torch.cuda.Stream(key[0], priority=priority)
    return _STREAMS[key]


def side_stream_made(device, role: str) -> bool:
    """Whether the stream of `role` on `device` exists: its cuBLAS workspace is then taken already."""
    return torch.device(device).type == "cuda" and _stream_key(device, role) in _STREAMS


def _stream_key(device, role: str) -> tuple:
    device = torch.device(device)
    if device.index is None:  # "cuda" and "cuda:0" are one device: one stream
        device = torch.device("cuda", torch.cuda.current_device())
    return device, role


@contextlib.contextmanager
def frame_loop_stream(device: torch.device):
    """Run the frame loop on the device's highest-priority stream, ordered with the caller's, ahead of the codec's."""
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
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_FAILED_CAPTURES))  # outlives even shutdown's clearing of globals


def _keep_forever(*objects) -> None:
    """Under cudaMallocAsync, what a failed capture allocated must never be freed."""
    if torch.cuda.get_allocator_backend() == "cudaMallocAsync":
        _FAILED_CAPTURES.append(objects)


@contextlib.contextmanager
def _collector_paused():
    """No automatic garbage collection inside: garbage holding a graph of the pool being captured into, freed mid
    capture, aborts the process; collecting before each capture would cost a fraction of a second each."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def capture(step: Callable[[], object], pool=None, warmup: int = 2, role: str = CAPTURE) -> CapturedStep:
    """Warm `step` up on `role`'s side stream, so what can fail fails before a capture allocates, then capture it there
    (graphs replayed at once need two streams, or share a cuBLAS workspace). It runs `warmup` times and once replayed:
    capture before its buffers matter."""
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
        # Run once now: under cudaMallocAsync freeing a never-run graph's memory aborts the process
        graph.replay()
        torch.cuda.synchronize()
    return CapturedStep(graph, outputs)


def trim_graph_memory() -> None:
    """Give destroyed graphs' memory back: under cudaMallocAsync CUDA's graph pool keeps it past empty_cache."""
    if not torch.cuda.is_initialized() or torch.cuda.get_allocator_backend() != "cudaMallocAsync":
        return
    try:
        driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    except OSError:  # no driver library under that name: nothing to trim through it
        return
    torch.cuda.synchronize()
    for index in range(torch.cuda.device_count()):
        driver.cuDeviceGraphMemTrim(index)
