"""bench/serve.py's schedule and statistics, pure functions of their inputs so tests can pin them without a server."""

from __future__ import annotations

import collections
from typing import Iterable

import numpy as np

from bench.sentences import SENTENCES

SAMPLE_RATE = 24000
BYTES_PER_SECOND = 2 * SAMPLE_RATE  # 16-bit mono PCM, what the server streams
FRAMES_PER_SECOND = 12.5  # codec frames a second of speech: max_new_tokens for a target length
EPSILON_S = 1e-6  # below any clock's meaning: a chunk due exactly as the audio before it ends is not late
CHARS_PER_SECOND = 15  # about how fast English text is spoken
SECONDS = (3.0, 10.0)  # the span each request's target length is drawn from


def arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Send times (seconds from the window's start) of a Poisson process of `rate` a second over `duration`:
    exponential gaps from a generator seeded by `seed` alone. The whole schedule is drawn before the first send,
    so no reply can move a send: the load stays open loop however slow the server gets."""
    rng = np.random.default_rng(seed)
    times, now = [], float(rng.exponential(1.0 / rate))
    while now < duration:
        times.append(now)
        now += float(rng.exponential(1.0 / rate))
    return times


def request_plan(times: list[float], seed: int) -> list[dict]:
    """A request for each send time: the seconds of speech it asks for (uniform over SECONDS), its text (about
    that many seconds of English) and max_new_tokens (the frame it ends at). Drawn from their own seeded stream,
    so the same seed asks for the same speech at every rate."""
    rng = np.random.default_rng([seed, 1])
    plan = []
    for at in times:
        seconds = round(float(rng.uniform(*SECONDS)), 3)  # as reported: max_new_tokens follows from it
        first = int(rng.integers(len(SENTENCES)))  # the sentences from a random one on, round and round
        text = " ".join((SENTENCES[first:] + SENTENCES[:first]) * 2)
        text = text[:text.rfind(" ", 0, int(round(seconds * CHARS_PER_SECOND)) + 1)]  # cut at a word's end
        plan.append(dict(scheduled_s=at, target_s=seconds, text=text,
                         max_new_tokens=int(round(FRAMES_PER_SECOND * seconds))))
    return plan


def percentile(values, q: float) -> float | None:
    """The q-th percentile (linear between samples, numpy's default); None for no values, so a rate where every
    request failed still reports."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def playback_gaps(chunks: list[tuple[float, int]], tolerance: float = 0.0) -> tuple[int, float]:
    """(gaps, gap seconds) a listener hears in a stream of (arrival time, bytes) chunks played as they come.
    Playback starts at the first chunk; a chunk is a gap when it arrives later than the audio received before it
    could play (by more than `tolerance`). The player waits for it there and plays on from its arrival, as a
    player does, so one slow chunk that delays every chunk after it is one gap, not one per chunk."""
    chunks = [(t, n) for t, n in chunks if n]
    if not chunks:
        return 0, 0.0
    gaps, gap_s = 0, 0.0
    plays_until = chunks[0][0] + chunks[0][1] / BYTES_PER_SECOND
    for t, n in chunks[1:]:
        if t > plays_until + tolerance + EPSILON_S:
            gaps, gap_s = gaps + 1, gap_s + (t - plays_until)
        plays_until = max(plays_until, t) + n / BYTES_PER_SECOND
    return gaps, gap_s


def peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    """Most requests in flight at once, from each one's (sent, done) times; one that ends as another starts does
    not overlap it."""
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def by_kind(kinds: Iterable[str] | collections.Counter) -> dict[str, int]:
    """How many of each kind (the kinds, or their counts), by name."""
    return dict(sorted(collections.Counter(kinds).items()))


def summarize(rate: float, records: list[dict]) -> dict:
    """One rate's line of the report, from its requests' records (bench.serve.send's). Latencies, real-time
    factors and gaps are over the requests that succeeded; the achieved rate is those per second of the window
    from the first send to the last request's end (failed ones included: the server was still busy with them)."""
    ok = [r for r in records if r["ok"]]
    errors = by_kind(r["error_kind"] for r in records if not r["ok"])
    window = max((r["end_s"] for r in records), default=0.0) - min((r["sent_s"] for r in records), default=0.0)
    out = dict(rate=rate, sent=len(records), ok=len(ok), errors=errors,
               window_s=round(window, 3), achieved_rate=round(len(ok) / window, 3) if window > 0 else 0.0)
    for key in ("ttfa_s", "e2e_s"):
        for q in (50, 95, 99):
            value = percentile([r[key] for r in ok], q)
            out[f"{key[:-2]}_p{q}_s"] = None if value is None else round(value, 4)
    rtf = [r["rtf"] for r in ok]
    out.update(rtf_p50=None if not rtf else round(percentile(rtf, 50), 3), rtf_min=round(min(rtf), 3) if rtf else None,
               streams_with_gaps=sum(1 for r in ok if r["gaps"]), gap_s_total=round(sum(r["gap_s"] for r in ok), 3),
               audio_s_total=round(sum(r["audio_s"] for r in ok), 3),
               peak_concurrency=peak_concurrency([(r["sent_s"], r["end_s"]) for r in records]),
               send_lag_max_s=round(max((r["sent_s"] - r["scheduled_s"] for r in records), default=0.0), 4))
    return out


# what a rate's windows are compared by (bench.serve --windows): each is one window's figure
SPREAD_KEYS = ("ttfa_p50_s", "ttfa_p95_s", "ttfa_p99_s", "e2e_p50_s", "e2e_p95_s", "achieved_rate",
               "streams_with_gaps", "gap_s_total", "peak_concurrency")


def across_windows(summaries: list[dict]) -> dict:
    """A rate's windows together: requests and errors summed, and each SPREAD_KEYS figure as the median of the
    windows' with its smallest and largest (None where no window has it: every request failed)."""
    errors = by_kind(sum((collections.Counter(s["errors"]) for s in summaries), collections.Counter()))
    out = dict(rate=summaries[0]["rate"], windows=len(summaries), sent=sum(s["sent"] for s in summaries),
               ok=sum(s["ok"] for s in summaries), errors=errors)
    for key in SPREAD_KEYS:
        values = [s[key] for s in summaries if s[key] is not None]
        out[key] = dict(median=round(float(np.median(values)), 4), min=min(values), max=max(values)) if values else None
    return out


def kill_summary(records: list[dict], kill_s: float, bound_s: float = 1.0) -> dict:
    """A window whose engine process was killed at kill_s (seconds from the window's start): the requests it held
    (sent before the kill, not ended by it) and those sent after it, each by outcome. A held request is answered
    in time when it ended, with audio or an error, within bound_s of the kill; one sent after it when it ended
    within bound_s of its send or got audio (the restart's wait is an error the client may send again after)."""

    def outcomes(rows: list[dict]) -> dict:
        return by_kind("ok" if r["ok"] else r["error_kind"] for r in rows)

    held = [r for r in records if r["sent_s"] <= kill_s < r["end_s"]]
    after = [r for r in records if r["sent_s"] > kill_s]
    return dict(kill_s=kill_s, bound_s=bound_s, held=len(held), held_outcomes=outcomes(held),
                held_in_time=sum(1 for r in held if r["end_s"] - kill_s <= bound_s),
                held_last_end_after_kill_s=round(max((r["end_s"] - kill_s for r in held), default=0.0), 4),
                sent_after=len(after), sent_after_outcomes=outcomes(after),
                sent_after_in_time=sum(1 for r in after if r["ok"] or r["e2e_s"] <= bound_s))
