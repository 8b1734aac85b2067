"""GET /metrics: what the server has done, in Prometheus's text format (a few counters: no client library)."""

from __future__ import annotations

import bisect
import collections
import itertools
import threading

# seconds to first audio, and real-time factor (seconds of audio per second of request), bucket upper bounds
TTFA_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
RTF_BUCKETS = (0.5, 1, 2, 4, 8, 16, 32, 64)


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds, self.counts, self.sum, self.total = bounds, [0] * len(bounds), 0.0, 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.total += 1

    def lines(self, name: str) -> list[str]:
        below = itertools.accumulate(self.counts)  # Prometheus's buckets count every value up to their bound
        return [f'{name}_bucket{{le="{bound:g}"}} {n}' for bound, n in zip(self.bounds, below, strict=True)] + [
            f'{name}_bucket{{le="+Inf"}} {self.total}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.total}"]


class Metrics:
    """Counts of requests by how they ended (ok, error, cancelled, busy), time to first audio, real-time factor."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: collections.Counter = collections.Counter()
        self.ttfa, self.rtf = _Histogram(TTFA_BUCKETS), _Histogram(RTF_BUCKETS)
        self.audio_seconds = 0.0

    def count(self, status: str) -> None:
        with self._lock:
            self.requests[status] += 1

    def first_audio(self, seconds: float) -> None:
        with self._lock:
            self.ttfa.observe(seconds)

    def finished(self, status: str, audio_seconds: float, seconds: float) -> None:
        with self._lock:
            self.requests[status] += 1
            self.audio_seconds += audio_seconds
            if status == "ok" and seconds > 0:
                self.rtf.observe(audio_seconds / seconds)

    def text(self, engine: dict) -> str:
        """The exposition: these counters beside the engine's gauges (LiveEngine.stats())."""
        with self._lock:
            lines = ["# HELP morph_requests_total Speech requests by how they ended.",
                     "# TYPE morph_requests_total counter"]
            lines += [f'morph_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]
            lines += ["# HELP morph_time_to_first_audio_seconds From a request's arrival to its first audio.",
                      "# TYPE morph_time_to_first_audio_seconds histogram",
                      *self.ttfa.lines("morph_time_to_first_audio_seconds"),
                      "# HELP morph_real_time_factor Seconds of audio per second of a request, finished ones.",
                      "# TYPE morph_real_time_factor histogram", *self.rtf.lines("morph_real_time_factor"),
                      "# TYPE morph_audio_seconds_total counter", f"morph_audio_seconds_total {self.audio_seconds:.3f}"]
        gauges = {"rows_live": "Rows decoding in the batch at its last frame.",
                  "rows_waiting": "Rows queued for a slot.",
                  "width": "Slots of the batch.",
                  "cache_slots": "Key/value cache slots the live rows use (prompt and frames so far)."}
        for key, help_text in gauges.items():
            lines += [f"# HELP morph_{key} {help_text}", f"# TYPE morph_{key} gauge", f"morph_{key} {engine[key]}"]
        return "\n".join(lines) + "\n"
