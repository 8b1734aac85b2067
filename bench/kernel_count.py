"""GPU kernels a frame, from the profiler: runs stopped after a set number of frames, differenced."""

from __future__ import annotations

import collections
import contextlib

import torch

from morph.api import MorphTTS


class Stop(Exception):
    """Raised from the per-frame hook to end a profiled run after a set number of frames."""


@contextlib.contextmanager
def stop_after(tts: MorphTTS, frames: int, upstream: bool):
    """End generation (with Stop) when frame `frames` + 1 is about to be decoded. Yields, for a morph stack, the
    on_step its decode takes (bench.stacks Runner.generate: a render's, called before every frame); for upstream
    None, its code predictor's generate (once a frame) counting instead."""
    count = [0]

    def tick():
        count[0] += 1
        if count[0] > frames:
            raise Stop

    if not upstream:
        yield lambda done, total: tick()
        return
    cp = tts.tts.model.talker.code_predictor

    def generate(*args, **kwargs):
        tick()
        return type(cp).generate(cp, *args, **kwargs)

    cp.generate = generate
    try:
        yield None
    finally:
        vars(cp).pop("generate", None)


def count_kernels(run_frames, a: int, b: int, top: int = 25) -> dict:
    """GPU kernels per frame: profile runs stopped after a and b frames and take the
    difference, which cancels the prompt's prefill. Kernel events only: record_function
    ranges, memcpy and memset are left out."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    per_run = []
    for n in (a, b):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            try:
                run_frames(n)
            except Stop:
                pass
            torch.cuda.synchronize()
        names = collections.Counter()
        times = collections.Counter()
        for e in prof.events():
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                continue
            if e.name.startswith(("Memcpy", "Memset", "[memory]")) or e.name.lower().startswith("memcpy"):
                continue
            names[e.name] += 1
            times[e.name] += e.time_range.elapsed_us()
        per_run.append((sum(names.values()), names, times))
    frames = b - a
    (na, ca, ta), (nb, cb, tb) = per_run
    diff_t = {k: (tb[k] - ta.get(k, 0)) / frames for k in tb}
    total_us = sum(diff_t.values())
    tops = sorted(diff_t.items(), key=lambda kv: -kv[1])[:top]
    return dict(
        kernels_per_frame=round((nb - na) / frames, 1),
        gpu_kernel_us_per_frame=round(total_us, 1),
        top_kernels=[dict(name=k[:90], us_per_frame=round(v, 2), calls_per_frame=round((cb[k] - ca.get(k, 0)) / frames, 1))
                     for k, v in tops],
    )
