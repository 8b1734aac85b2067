"""bench/serve.py and bench/serve_stats.py: the statistics on made-up streams, the Poisson schedule, and a short
open-loop run against a stub server whose replies have known timings (uvicorn in a thread of this process), and
the --serve path's start and stop of a server subprocess. No model: what is measured is the client."""

import asyncio
import json
import sys
import threading
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from bench import serve
from bench.serve_stats import (across_windows, arrivals, kill_summary, peak_concurrency, percentile, playback_gaps,
                               request_plan, summarize)

CHUNK = 4800  # bytes: 0.1 s of 24 kHz 16-bit audio
STUB_CHUNK = 3 * CHUNK  # the stub's: 0.3 s each
# before each of the stub's chunks: the first at 0.2 s, the third 0.24 s after the second's end; the second and the
# fourth 0.28 s ahead of playback, so that a loaded machine (CI's two cores) does not hear a gap in them
DELAYS = (0.2, 0.02, 0.82, 0.02)
MARKER = "torch"  # a word of some texts: the stub answers 429 to them
KEY = "sekret"
app = FastAPI()
bodies: list[dict] = []


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/v1/audio/speech")
async def speech(request: Request):
    body = await request.json()
    bodies.append(body)
    if request.headers.get("authorization") != f"Bearer {KEY}":
        return JSONResponse({"error": {"message": "bad key", "type": "auth", "param": None, "code": None}}, 401)
    if MARKER in body["input"]:
        return JSONResponse({"error": {"message": "busy", "type": "rate_limit", "param": None, "code": None}}, 429,
                            headers={"Retry-After": "1"})

    async def audio():
        for delay in DELAYS:
            await asyncio.sleep(delay)
            yield b"\0" * STUB_CHUNK

    return StreamingResponse(audio(), media_type="audio/pcm")


def test_chunks_in_time_have_no_gap_and_one_late_chunk_is_one_gap_of_its_lateness():
    on_time = [(0.5 + 0.1 * i, CHUNK) for i in range(10)]  # each arrives as the one before ends
    assert playback_gaps(on_time) == (0, 0.0)
    late = on_time[:5] + [(1.3, CHUNK)] + on_time[6:]  # due at 1.0
    gaps, gap_s = playback_gaps(late)
    assert gaps == 1 and gap_s == pytest.approx(0.3)
    assert playback_gaps(late, tolerance=0.35) == (0, 0.0)
    # a stall that delays every chunk after it is heard once: the player plays on from the late chunk
    shifted = on_time[:5] + [(t + 0.3, n) for t, n in on_time[5:]]
    assert playback_gaps(shifted) == (1, pytest.approx(0.3))
    assert playback_gaps([]) == (0, 0.0) and playback_gaps([(1.0, 0), (2.0, CHUNK)]) == (0, 0.0)


def test_percentiles_and_peak_concurrency():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5) and percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 95) == 3.0 and percentile([], 50) is None
    assert peak_concurrency([(0, 1), (0.5, 2), (0.6, 0.7), (1, 3)]) == 3
    assert peak_concurrency([(0, 1), (1, 2)]) == 1 and peak_concurrency([]) == 0


def test_the_poisson_schedule_is_seeded_has_the_rate_and_asks_for_3_to_10_s():
    assert arrivals(5, 10, seed=3) == arrivals(5, 10, seed=3) != arrivals(5, 10, seed=4)
    times = arrivals(20, 2000, seed=0)
    assert np.mean(np.diff(times)) == pytest.approx(1 / 20, rel=0.03)
    assert times == sorted(times) and 0 < times[0] and times[-1] < 2000
    plan = request_plan(times[:500], seed=0)
    assert [p["scheduled_s"] for p in plan] == times[:500]
    again = request_plan(arrivals(5, 200, seed=7)[:500], seed=0)  # another rate, the same speech asked for
    assert [p["text"] for p in again] == [p["text"] for p in plan][:len(again)]
    for p in plan:
        assert 3 <= p["target_s"] <= 10 and p["max_new_tokens"] == round(12.5 * p["target_s"])
        assert abs(len(p["text"]) - 15 * p["target_s"]) < 15 and not p["text"].endswith(" ")


def test_summary_counts_errors_by_kind_and_rates_ok_requests_over_the_window():
    def record(sent, end, ok=True, kind=None):
        return dict(scheduled_s=sent, sent_s=sent, end_s=end, ok=ok, error_kind=kind, ttfa_s=0.1, e2e_s=end - sent,
                    rtf=2.0, gaps=1 if sent == 0 else 0, gap_s=0.25 if sent == 0 else 0.0, audio_s=1.0)

    s = summarize(2.0, [record(0, 1), record(0.5, 3), record(0.8, 1.5, False, "http_429"), record(2, 4, False,
                                                                                                     "timeout")])
    assert s["sent"] == 4 and s["ok"] == 2 and s["errors"] == {"http_429": 1, "timeout": 1}
    assert s["window_s"] == 4 and s["achieved_rate"] == 0.5 and s["peak_concurrency"] == 3
    assert s["e2e_p50_s"] == 1.75 and s["streams_with_gaps"] == 1 and s["gap_s_total"] == 0.25


def test_a_rates_windows_give_each_figures_median_smallest_and_largest_and_their_sums():
    def window(p95, ok, errors, achieved=None):
        return dict(rate=5.0, sent=ok + sum(errors.values()), ok=ok, errors=errors, ttfa_p50_s=0.01, ttfa_p95_s=p95,
                    ttfa_p99_s=p95, e2e_p50_s=1.0, e2e_p95_s=2.0, achieved_rate=achieved, streams_with_gaps=ok // 2,
                    gap_s_total=0.5, peak_concurrency=ok)

    s = across_windows([window(0.3, 4, {"timeout": 1}), window(0.1, 6, {}), window(0.14, 1, {"timeout": 2,
                                                                                                "http_429": 1})])
    assert (s["rate"], s["windows"], s["sent"], s["ok"]) == (5.0, 3, 15, 11)
    assert list(s["errors"].items()) == [("http_429", 1), ("timeout", 3)]  # by name, as each window's
    assert s["ttfa_p95_s"] == dict(median=0.14, min=0.1, max=0.3)  # the median, not the mean (0.18)
    assert s["streams_with_gaps"] == dict(median=2, min=0, max=3) and s["achieved_rate"] is None


def test_a_killed_engines_window_counts_who_it_held_and_how_soon_each_ended():
    def record(sent, end, ok=False, kind="transport"):
        return dict(sent_s=sent, end_s=end, e2e_s=end - sent, ok=ok, error_kind=None if ok else kind)

    records = [record(0.0, 1.0, ok=True), record(1.0, 2.0, ok=True),  # done before the kill, or as it came
               record(1.0, 2.3), record(1.5, 3.1), record(2.0, 2.5, ok=True), record(1.2, 3.0),  # held: one 1.1 s on
               record(2.1, 2.2, kind="http_503"), record(3.5, 8.0, ok=True), record(4.0, 5.5, kind="timeout"),
               record(4.5, 4.6, kind="http_503"), record(5.0, 5.2, kind="http_503")]
    s = kill_summary(records, kill_s=2.0)
    assert (s["held"], s["held_in_time"], s["held_last_end_after_kill_s"]) == (4, 3, 1.1)
    assert s["held_outcomes"] == {"ok": 1, "transport": 3}
    assert (s["sent_after"], s["sent_after_in_time"]) == (5, 4)
    assert s["sent_after_outcomes"] == {"http_503": 3, "ok": 1, "timeout": 1}
    late = kill_summary(records, kill_s=9.0)  # after every request
    assert (late["held"], late["held_last_end_after_kill_s"], late["sent_after"]) == (0, 0.0, 0)


def test_the_engine_to_kill_is_the_last_one_its_server_logged(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"INFO serve: the engine's process 41 is up\nWARNING it ended\n"
                    b"INFO serve: the engine's process 97 is up\n")
    assert serve.engine_pid(log) == 97
    log.write_bytes(b"INFO nothing yet\n")
    with pytest.raises(RuntimeError, match="--kill-engine: the server logged no engine process"):
        serve.engine_pid(log)


@pytest.mark.parametrize("argv", [["--kill-engine", "1"], ["--serve", "x", "--kill-engine", "40"],
                                  ["--windows", "0"]])
def test_a_kill_needs_a_started_server_and_a_time_in_the_window(argv, capsys):
    with pytest.raises(SystemExit):
        serve.main(["--duration", "30", *argv])
    assert "--kill-engine needs --serve" in capsys.readouterr().err or "--windows" in argv


def _serve_stub():
    """The stub on a free port in a daemon thread: its URL, and the server to stop."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=serve.free_port(), log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the stub did not start"
        time.sleep(0.05)
    return f"http://127.0.0.1:{server.config.port}", server


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    url, server = _serve_stub()
    path = tmp_path_factory.mktemp("serve") / "serve.json"
    try:
        out = serve.main(["--url", url, "--rates", "6", "--duration", "2", "--seed", "1", "--warmup", "1",
                          "--api-key", KEY, "--timeout", "10", "--extra", '{"language": "English"}',
                          "--json", str(path)])
    finally:
        server.should_exit = True
    assert json.loads(path.read_text()) == out
    return out


def test_each_window_of_a_rate_has_its_own_arrivals_and_the_rate_its_spread(tmp_path):
    url, server, before = *_serve_stub(), len(bodies)
    try:
        out = serve.main(["--url", url, "--rates", "4", "--duration", "1.5", "--windows", "2", "--seed", "3",
                          "--api-key", KEY, "--timeout", "10"])
    finally:
        server.should_exit = True
        del bodies[before:]  # the module's other run counts its own
    first, second = out["rates"]
    assert (first["summary"]["window"], second["summary"]["window"]) == (0, 1)
    assert [r["scheduled_s"] for r in first["requests"]] == pytest.approx(arrivals(4, 1.5, 3), abs=1e-4)
    assert [r["scheduled_s"] for r in second["requests"]] == pytest.approx(
        arrivals(4, 1.5, 3 + serve.WINDOW_SEED_STEP), abs=1e-4)
    (spread,) = out["spreads"]
    assert spread["windows"] == 2 and spread["sent"] == first["summary"]["sent"] + second["summary"]["sent"]
    p95 = sorted(w["summary"]["ttfa_p95_s"] for w in out["rates"] if w["summary"]["ttfa_p95_s"] is not None)
    assert spread["ttfa_p95_s"] is None or (spread["ttfa_p95_s"]["min"], spread["ttfa_p95_s"]["max"]) == (
        p95[0], p95[-1])


def test_the_run_records_every_request_with_the_stubs_timings(report):
    (rate,) = report["rates"]
    records = rate["requests"]
    assert report["complete"] and len(records) == rate["summary"]["sent"] == len(arrivals(6, 2, 1)) >= 6
    assert len(bodies) == len(records) + 1  # and the warm-up's, unrecorded
    ok = [r for r in records if r["ok"]]
    assert ok and all(MARKER not in r["text"] for r in ok)
    for r in ok:
        assert r["status"] == 200 and r["bytes"] == STUB_CHUNK * len(DELAYS) and r["audio_s"] == r["bytes"] / 48000
        assert r["ttfa_s"] == pytest.approx(DELAYS[0], abs=0.15) and r["e2e_s"] >= sum(DELAYS)
        assert r["rtf"] == pytest.approx(r["audio_s"] / r["e2e_s"], rel=1e-2)
        assert r["gaps"] == 1 and r["gap_s"] == pytest.approx(0.24, abs=0.12)  # the third chunk's
    assert rate["summary"]["ok"] == len(ok) and rate["summary"]["streams_with_gaps"] == len(ok)


def test_429s_are_errors_with_their_status_message_and_retry_after(report):
    (rate,) = report["rates"]
    refused = [r for r in rate["requests"] if MARKER in r["text"]]
    assert refused and rate["summary"]["errors"] == {"http_429": len(refused)}
    for r in refused:
        assert (r["ok"], r["status"], r["error_kind"], r["error"], r["retry_after"]) == (False, 429, "http_429",
                                                                                       "busy", "1")


def test_requests_are_sent_on_schedule_not_after_replies(report):
    """Each request takes longer (1.06 s) than the mean gap between sends (1/6 s): sent on schedule anyway, so
    several are in flight at once."""
    records = report["rates"][0]["requests"]
    assert all(abs(r["sent_s"] - r["scheduled_s"]) < 0.1 for r in records)
    assert report["rates"][0]["summary"]["peak_concurrency"] > 1
    plan = request_plan(arrivals(6, 2, 1), 1)
    for i, (r, p) in enumerate(zip(records, plan)):
        assert r["text"] == p["text"]
        assert dict(model="qwen3-tts", input=p["text"], voice="alice", response_format="pcm",
                                       stream_format="audio", seed=1 + i, max_new_tokens=p["max_new_tokens"],
                                       language="English") in bodies
    assert "api_key" not in report["settings"] and report["environment"]["python"]


def test_serving_starts_a_server_waits_for_health_and_stops_it(tmp_path):
    code = ("import sys, uvicorn; from tests.bench.test_serve import app; "
            "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[-1]))")
    log = tmp_path / "server.log"
    with serve.serving([sys.executable, "-c", code], log, start_timeout=60) as url:
        assert serve.healthy(url)
    assert not serve.healthy(url) and "Shutting down" in log.read_text()
    with pytest.raises(RuntimeError, match="exited"):
        with serve.serving([sys.executable, "-c", "raise SystemExit(3)"], log, start_timeout=60):
            pass
