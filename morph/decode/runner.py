"""How a decode step runs, and what happens when the fast way fails: the one place that decides the modes
(docs/architecture.md, Decode modes). A wait the user sees is announced with `extra={"status": True}` for hosts."""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from ..settings import MODES, RETIRED_MODES
from .. import graphs
from .lean import LeanUnsupported

log = logging.getLogger(__name__)

FAST_MODES = ("graphs", "fused")

# What the wait is (bench/results/h100-2026-11-22d); a plain CUDA graph's is not announced
PREPARE_TIME = {"fused": "about 10 s the first time on this machine, while Triton compiles its kernels, and about 1 s "
                         "after that (they are cached on disk)"}
_prepared: set[str] = set()  # modes prepared once in this process: their kernels are loaded


def check_mode(mode: str, who: str = "morph") -> str:
    """The mode to run: `mode` itself, or what runs in place of a retired one (logged)."""
    if mode in RETIRED_MODES:
        log.warning("%s: speed mode %r was retired (slower than %s, and minutes to build on its first call); "
                    "running %s instead", who, mode, RETIRED_MODES[mode], RETIRED_MODES[mode])
        return RETIRED_MODES[mode]
    if mode not in MODES:
        raise ValueError(f"{who}: mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


_logged: set[str] = set()


def _log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log.warning(msg)


def device_note(mode: str, device: torch.device) -> str | None:
    """Why `mode` will not run as picked on `device`, in one line; None when it will."""
    mode = RETIRED_MODES.get(mode, mode)
    if mode in FAST_MODES and device.type != "cuda":
        return f"{mode} mode needs a CUDA GPU; on {device.type} it runs eager (op by op, several times slower)"
    if mode in ("fused", "auto") and device.type == "cuda" and not graphs.triton_available():
        return ("the fused decoder needs Triton, which is not installed; using plain CUDA graphs, about 3x slower "
                "(install triton, or triton-windows on Windows, for the fast decoder)")
    return None


def resolve(mode: str, device: torch.device, lean_check: Callable[[], None]) -> str:
    """What `mode` runs as on `device`; `lean_check` raises LeanUnsupported for layers the lean path lacks."""
    mode = check_mode(mode)
    note = device_note(mode, device)
    if note:
        _log_once(f"morph: {note}")
    if mode == "auto":
        mode = "fused" if device.type == "cuda" else "eager"
    if mode in FAST_MODES and device.type != "cuda":
        return "eager"
    if mode == "fused" and not graphs.triton_available():
        mode = "graphs"
    if mode != "eager":
        try:
            lean_check()
        except LeanUnsupported as e:
            _log_once(f"morph: the fast layers do not support this checkpoint ({e}); running eager")
            return "eager"
    return mode


def fast_step(cache: graphs.GraphCache, key, step: Callable[[], object], fallback: Callable[[], object], mode: str,
              keep=None) -> Callable[[], object]:
    """One frame in a fast mode: the captured graph's replay, or `fallback` for this run when the capture fails."""
    # after a failed capture the cache gives None until the next run binds it: nothing is prepared, nothing announced
    captured, start = key not in cache and not cache.failed, time.perf_counter()
    announce = captured and mode in PREPARE_TIME and mode not in _prepared
    if announce:
        log.info("morph: preparing the %s decoder, %s; generation starts when it is ready", mode,
                 PREPARE_TIME[mode], extra={"status": True})
    entry = cache.get_or_none(key, step, f"morph: could not prepare the {mode} decoder (%s); this run decodes op by "
                              "op, several times slower; the next run tries again. If this repeats, set speed_mode "
                              "to graphs or eager and report it")
    if entry is None:
        return fallback
    if captured:
        _prepared.add(mode)
        log.info("morph: the %s decoder is ready (prepared in %.1f s)", mode, time.perf_counter() - start,
                 extra={"status": announce})
    entry.keep = keep
    return entry.replay
