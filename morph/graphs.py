"""CUDA graphs for the morph steps: capture once per key, replay many times.

A step function is captured lazily the first time its key (seq_groups, batch, dtype,
sampling, ...) is asked for and replayed after that. Everything a replay reads or writes
between frames lives in buffers allocated outside the capture, so the memory a graph
takes from its pool is scratch only; all graphs of one model share one pool, and a
bounded LRU keeps the number of graphs (and so the pool) from growing when seq_groups or
the batch size changes. A change of device, dtype or weight storage drops them all.

`mode` names how a step runs:
- "eager":   upstream HF layers (the CPU reference; exact against qwen-tts);
- "lean":    the lean layers (morph/lean.py), run op by op, no graph;
- "graphs":  the lean layers captured in CUDA graphs (starts in well under a second);
- "compile": the lean layer stacks compiled by torch.compile (static shapes), then
             captured in CUDA graphs: the fastest, with a compile of tens of seconds on
             the first call of a process (Inductor caches it on disk for later runs).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)

MODES = ("auto", "eager", "lean", "graphs", "compile")
GRAPH_MODES = ("graphs", "compile")


class GraphUnavailable(RuntimeError):
    """A CUDA graph could not be captured; the caller runs upstream's eager path instead."""


def check_mode(mode: str, who: str = "morph") -> str:
    if mode not in MODES:
        raise ValueError(f"{who}: mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def resolve_mode(mode: str, device: torch.device) -> str:
    """What `mode` means on this device: graphs need CUDA; elsewhere they run "eager"."""
    check_mode(mode)
    if mode == "auto":
        return "graphs" if device.type == "cuda" else "eager"
    if mode in GRAPH_MODES and device.type != "cuda":
        _log_once(f"morph: {mode} mode needs a CUDA GPU; running eager on {device.type}")
        return "eager"
    if mode == "compile" and not compile_available():
        _log_once("morph: torch.compile (Triton) is unavailable here; using CUDA graphs without compile")
        return "graphs"
    return mode


_logged: set[str] = set()


def _log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log.warning(msg)


def compile_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return hasattr(torch, "compile")


class CapturedStep:
    """One captured graph and the outputs its capture returned (static tensors)."""

    def __init__(self, graph, outputs):
        self.graph = graph
        self.outputs = outputs

    def replay(self):
        self.graph.replay()
        return self.outputs


class GraphCache:
    """An LRU of captured steps sharing one memory pool.

    `capture_fn(step)` is injectable so the bookkeeping can be tested without a GPU.
    """

    def __init__(self, max_graphs: int = 4, capture_fn: Callable | None = None):
        self.max_graphs = max_graphs
        self._graphs: collections.OrderedDict = collections.OrderedDict()
        self._capture = capture_fn or capture
        self._pool = None
        self._owner = None  # (device, dtype, weights fingerprint) the graphs were captured against
        self.capture_seconds: dict = {}

    def __len__(self) -> int:
        return len(self._graphs)

    def keys(self):
        return list(self._graphs)

    def bind(self, owner) -> None:
        """Drop every graph if the device, dtype or weight storage changed since capture."""
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
        if self._pool is None and self._capture is capture:
            self._pool = torch.cuda.graph_pool_handle()
        start = time.perf_counter()
        entry = self._capture(step, self._pool)
        seconds = time.perf_counter() - start
        self.capture_seconds[key] = seconds
        log.info("morph: captured a CUDA graph for %s in %.2f s", key, seconds)
        self._graphs[key] = entry
        return entry

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None
        self.capture_seconds.clear()


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


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One warm-up/capture stream per device, reused by every capture: cuBLAS keeps a
    workspace (32 MiB on Hopper) per stream it has seen, so a new stream per capture
    would leak one workspace per graph."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device)
    return _STREAMS[device]


def capture(step: Callable[[], object], pool=None, warmup: int = 2) -> CapturedStep:
    """Warm `step` up on the side stream (compiles, cuBLAS handles, allocator), then capture it there."""
    device = torch.device("cuda", torch.cuda.current_device())
    side = _side_stream(device)
    with _rng_preserved(device):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=side):
            outputs = step()
        torch.cuda.synchronize()
    return CapturedStep(graph, outputs)


# -- torch.compile of the lean stacks ---------------------------------------------------
_COMPILED: dict = {}


def compiled(fn: Callable, mode: str = "max-autotune-no-cudagraphs", exact_rng: bool = False) -> Callable:
    """`fn` compiled once per process with static shapes (one compile per shape set).

    max-autotune-no-cudagraphs picks Triton GEMMs for the batch-1 GEMVs and tunes them
    by coordinate descent (torch's mode includes it); it leaves CUDA graphs to us, and
    the compiled kernels are captured inside our own graphs. The options are passed per
    function, so no global Inductor setting of the host process is changed. exact_rng
    keeps ATen's random ops (Inductor's `fallback_random`), so a compiled sampler draws
    the same numbers from the same generator state as the eager one.
    """
    key = (fn, mode, exact_rng)
    if key not in _COMPILED:
        from torch._inductor import list_mode_options

        options = dict(list_mode_options(mode))
        if exact_rng:
            options["fallback_random"] = True
        _COMPILED[key] = torch.compile(fn, options=options, fullgraph=True, dynamic=False)
    return _COMPILED[key]
