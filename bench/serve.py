"""Open-loop load test of the speech server (`cli.py serve`, OpenAI's POST /v1/audio/speech, streamed PCM).

For each rate of `--rates` (requests a second), requests are sent for `--duration` seconds at Poisson arrival times
(exponential gaps, seeded by `--seed`), each on its own task whether or not earlier ones have answered: open loop,
as independent users arrive, so a slow server meets a growing queue instead of a politely waiting client. Then the
client waits for all of them (each at most `--timeout` s, counted as an error past it). Each request asks for 3 to 10 s
of speech (drawn uniformly): an English text of about that many seconds (15 characters a second) and
max_new_tokens = round(12.5 x seconds), 12.5 codec frames a second, so that on random weights (which never emit the
end token) each request still ends at its own frame, as the batch benches' lines do; real weights end at their EOS.

Per request: the time to first audio (send to the first non-empty body chunk), end to end (send to the last byte),
seconds of audio (bytes / 2 / 24000), the real-time factor (seconds of audio / end-to-end seconds: above 1 is
faster than real time), and playback gaps (bench/serve_stats.playback_gaps: where a listener playing from the
first chunk on would wait); on failure the status, error kind and message (429/503 with their Retry-After,
connection errors, timeouts). Per rate: requests sent, ok, errors by kind, the achieved rate (ok requests a second
from the first send to the last end), TTFA and end to end p50/p95/p99, real-time factor p50 and min, streams with
gaps and their seconds, and the peak of requests in flight. With `--windows N` each rate runs N windows, each its
own arrivals and texts (seeded by `--seed` and the window), and a line per rate gives each figure's median over
them with its smallest and largest (bench/serve_stats.across_windows).

With `--serve` and `--kill-engine S`, one more window at the last rate follows, whose engine process (the pid its
server logs) is killed S s in: the report's "kill" says how many requests it held, how each ended and how soon after
the kill (bench/serve_stats.kill_summary), how long the server took to answer GET /health 200 again, and how the
requests sent one at a time after that ended.

A table goes to stdout; `--json` gets the settings, the environment, each window's summary and every request's
record (saved after each window), the rates' spreads and the kill.

    python -m bench.serve --rates 1,5,20 --duration 30 --json out/serve.json                 # a running server
    python -m bench.serve --serve "--model /tmp/model-0.6b" --rates 1,5 --json out/serve.json  # starts one
    python -m bench.serve --serve "--model /tmp/model-0.6b" --rates 20 --windows 3 --kill-engine 4 --json out/s.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import soundfile as sf

from bench.sentences import reference_wave
from bench.serve_stats import (BYTES_PER_SECOND, across_windows, arrivals, kill_summary, playback_gaps,
                               request_plan, summarize)

ROOT = Path(__file__).resolve().parent.parent
WINDOW_SEED_STEP = 1000  # window w's arrivals and texts are seeded by --seed + w * this: window 0's are --seed's
ENGINE_UP = re.compile(rb"the engine's process (\d+) is up")  # morph/engine/process.py's log line
AFTER_RESTART = 3  # requests sent one at a time once a killed engine's server answers /health again


async def send(client: httpx.AsyncClient, url: str, body: dict, timeout: float, gap_tolerance: float,
               origin: float) -> dict:
    """One request, streamed to its end: its record (times in seconds from `origin`, the rate window's start)."""
    start = time.perf_counter()
    chunks: list[tuple[float, int]] = []  # (arrival, bytes): filled as they come, so a timeout keeps what came
    reply: dict = dict(status=None, retry_after=None)

    async def stream():
        async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
            reply.update(status=response.status_code, retry_after=response.headers.get("retry-after"))
            if not response.is_success:
                return error_message(await response.aread())
            async for data in response.aiter_bytes():
                if data:
                    chunks.append((time.perf_counter(), len(data)))
            return None

    try:
        failure = await asyncio.wait_for(stream(), timeout)
        kind = None if failure is None else f"http_{reply['status']}"
        if failure is None and not chunks:
            kind, failure = "empty", "the reply ended with no audio"
    except (asyncio.TimeoutError, httpx.TimeoutException):
        kind, failure = "timeout", f"no end within {timeout} s"
    except httpx.ConnectError as e:
        kind, failure = "connection", str(e) or type(e).__name__
    except httpx.TransportError as e:  # the connection broke mid-reply
        kind, failure = "transport", str(e) or type(e).__name__
    end = time.perf_counter()
    nbytes = sum(n for _, n in chunks)
    gaps, gap_s = playback_gaps(chunks, gap_tolerance)
    e2e = end - start
    return dict(sent_s=round(start - origin, 4), end_s=round(end - origin, 4), ok=kind is None, error_kind=kind,
                error=failure, **reply, ttfa_s=round(chunks[0][0] - start, 4) if chunks else None,
                e2e_s=round(e2e, 4), bytes=nbytes, audio_s=round(nbytes / BYTES_PER_SECOND, 4),
                rtf=round(nbytes / BYTES_PER_SECOND / e2e, 4), chunks=len(chunks), gaps=gaps, gap_s=round(gap_s, 4))


def error_message(raw: bytes) -> str:
    """OpenAI's error JSON's message, or the body as text where a peer or proxy answered otherwise."""
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:500]


def request_body(args, item: dict, index: int) -> dict:
    return dict(model=args.model, input=item["text"], voice=args.voice, response_format="pcm", stream_format="audio",
                seed=args.seed + index, max_new_tokens=item["max_new_tokens"], **args.extra)


async def run_rate(client: httpx.AsyncClient, args, url: str, rate: float, seed: int,
                   origin: float | None = None) -> list[dict]:
    """One window at `rate`, its arrivals and texts seeded by `seed`, from `origin` (perf_counter; now when None):
    every request sent at its planned time on its own task, then all awaited."""
    plan = request_plan(arrivals(rate, args.duration, seed), seed)
    origin = time.perf_counter() if origin is None else origin
    tasks = []
    for i, item in enumerate(plan):
        await asyncio.sleep(max(0.0, origin + item["scheduled_s"] - time.perf_counter()))
        tasks.append(asyncio.create_task(send(client, url, request_body(args, item, i), args.timeout,
                                              args.gap_tolerance, origin)))
    records = await asyncio.gather(*tasks)
    return [dict(index=i, scheduled_s=round(item["scheduled_s"], 4), target_s=item["target_s"],
                 max_new_tokens=item["max_new_tokens"], text=item["text"], **record)
            for i, (item, record) in enumerate(zip(plan, records))]


async def measure(args, url: str, report: dict, server_log: Path | None) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=args.timeout) as client:
        report["voice_made"] = await ensure_voice(client, url, args.voice)
        # warm-up: one at a time, the server's first calls (captures, compilation) kept out of the numbers
        for item in request_plan([0.0] * args.warmup, args.seed + 1):
            await send(client, url, request_body(args, item, 0), args.timeout, args.gap_tolerance, 0.0)
        for rate in args.rates:
            summaries = []
            for window in range(args.windows):
                records = await run_rate(client, args, url, rate, args.seed + WINDOW_SEED_STEP * window)
                summaries.append(dict(summarize(rate, records), window=window))
                report["rates"].append(dict(summary=summaries[-1], requests=records))
                save(report, args.json)
                print_row(summaries[-1])
            if args.windows > 1:
                report["spreads"].append(across_windows(summaries))
                save(report, args.json)
                print_spread(report["spreads"][-1])
        if args.kill_engine is not None:
            report["kill"] = await kill_window(client, args, url, server_log)
            save(report, args.json)
            print("kill:", json.dumps(report["kill"]["summary"]), flush=True)


async def kill_window(client: httpx.AsyncClient, args, url: str, server_log: Path) -> dict:
    """A window at the last rate whose engine process is killed args.kill_engine s in (module docstring)."""
    rate, seed = args.rates[-1], args.seed + WINDOW_SEED_STEP * args.windows  # arrivals no window had
    origin = time.perf_counter()

    async def kill() -> dict:
        await asyncio.sleep(args.kill_engine)
        pid = engine_pid(server_log)
        os.kill(pid, signal.SIGKILL)
        killed, restart_s = time.perf_counter(), None
        down = False  # /health may answer 200 for the moment the server takes to see its engine gone
        while restart_s is None and time.perf_counter() - killed < args.start_timeout:
            up = await client_healthy(client, url)
            down = down or not up
            if up and down:
                restart_s = round(time.perf_counter() - killed, 3)
            else:
                await asyncio.sleep(0.1)
        return dict(pid=pid, kill_s=round(killed - origin, 4), restart_s=restart_s)

    killer = asyncio.create_task(kill())
    records = await run_rate(client, args, url, rate, seed, origin)
    killed = await killer
    after = [await send(client, url, request_body(args, item, i), args.timeout, args.gap_tolerance, 0.0)
             for i, item in enumerate(request_plan([0.0] * AFTER_RESTART, seed + 1))]
    return dict(rate=rate, **killed, summary=kill_summary(records, killed["kill_s"]), requests=records,
                after_restart=after)


def engine_pid(server_log: Path) -> int:
    """The engine process's id, from the last line its server logged of one coming up."""
    found = ENGINE_UP.findall(server_log.read_bytes())
    if not found:
        raise RuntimeError(f"--kill-engine: the server logged no engine process ({server_log}); it needs one that "
                           "runs its engine in a process of its own (cli.py serve)")
    return int(found[-1])


async def client_healthy(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(f"{url}/health", timeout=2.0)).status_code == 200
    except httpx.TransportError:
        return False


async def ensure_voice(client: httpx.AsyncClient, url: str, name: str) -> bool:
    """Save `name` on the server from a synthetic clip when the server lists voices and has none of that name (a
    random-weight model clones any clip alike); True when it was made. A server without the voices routes (a peer)
    is left as it is."""
    listed = await client.get(f"{url}/v1/audio/voices")
    if listed.status_code != 200 or name in {v.get("id") for v in listed.json().get("data", [])}:
        return False
    data = io.BytesIO()
    sf.write(data, reference_wave(), 24000, format="WAV", subtype="PCM_16")
    made = await client.post(f"{url}/v1/audio/voices", data={"name": name},
                             files={"audio_sample": ("voice.wav", data.getvalue(), "audio/wav")})
    made.raise_for_status()
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(argv: list[str], log_path: Path, start_timeout: float):
    """The server `argv + --port <free port>` as a subprocess, its output in log_path: its URL once GET /health
    answers 200; stopped on the way out (SIGINT, its clean shutdown, then killed if it hangs)."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv + ["--port", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while not healthy(url):
            if process.poll() is not None:
                raise RuntimeError(f"the server exited ({process.returncode}) before it was ready: see {log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not ready within {start_timeout} s: see {log_path}")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def environment() -> dict:
    """Where the client ran; with torch installed also the project commit and the CUDA device, which is the
    server's too where the server runs here (--serve, or a local --url). torch is optional: a client-only install
    measures a remote server."""
    env = dict(python=platform.python_version(), platform=platform.platform())
    try:
        import torch

        from bench.common import project_commit  # imports the engine: only where torch is installed
    except ImportError:
        return env
    return dict(project_commit(), **env, torch=torch.__version__,
                cuda_device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)


def save(report: dict, json_path: str | None) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2))


COLUMNS = ("rate", "sent", "ok", "errors", "achieved_rate", "ttfa_p50_s", "ttfa_p95_s", "ttfa_p99_s", "e2e_p50_s",
           "e2e_p95_s", "e2e_p99_s", "rtf_p50", "rtf_min", "streams_with_gaps", "gap_s_total", "peak_concurrency")


def print_row(summary: dict) -> None:
    print(" ".join(f"{_cell(summary[c]):>{max(8, len(c))}}" for c in COLUMNS), flush=True)


def print_spread(spread: dict) -> None:
    """A rate's windows: each figure's median [smallest, largest]."""
    cells = [f"rate {spread['rate']}: {spread['windows']} windows, {spread['ok']}/{spread['sent']} ok"]
    for key in ("ttfa_p50_s", "ttfa_p95_s", "achieved_rate", "streams_with_gaps"):
        v = spread[key]
        cells.append(f"{key} " + ("-" if v is None else f"{_cell(v['median'])} [{_cell(v['min'])}, {_cell(v['max'])}]"))
    print("  " + "; ".join(cells), flush=True)


def _cell(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (ignored with --serve)")
    p.add_argument("--rates", default="1,5,20", help="requests a second, one window each, comma-separated")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of sending at each rate")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take, past it an error")
    p.add_argument("--voice", default="alice")
    p.add_argument("--model", default="qwen3-tts", help="sent as the request's model")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument("--seed", type=int, default=0, help="seeds the arrivals, the texts and each request's seed")
    p.add_argument("--warmup", type=int, default=0, help="requests sent one at a time first, not recorded")
    p.add_argument("--gap-tolerance", type=float, default=0.0, help="seconds a chunk may be late before a gap")
    p.add_argument("--extra", type=json.loads, default={}, help="JSON object merged into every request's body")
    p.add_argument("--serve", help="start `cli.py serve SERVE --port <free port>` for the run (its log by --json)")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds --serve waits for GET /health")
    p.add_argument("--windows", type=int, default=1, help="windows at each rate, each its own arrivals and texts")
    p.add_argument("--kill-engine", type=float, metavar="S",
                   help="with --serve: after the rates, a window at the last rate whose engine process is killed S s in")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not args.rates or min(args.rates) <= 0:
        p.error("--rates must be positive numbers")
    if not isinstance(args.extra, dict):
        p.error("--extra must be a JSON object")
    if args.windows < 1:
        p.error("--windows must be at least 1")
    if args.kill_engine is not None and (args.serve is None or not 0 < args.kill_engine < args.duration):
        p.error("--kill-engine needs --serve (its server's log names the engine's process) and a time inside "
                "--duration")
    settings = {k: v for k, v in vars(args).items() if k != "api_key"}  # the key stays out of the file
    report = dict(settings=settings, environment=environment(), rates=[], spreads=[], complete=False)
    print(" ".join(f"{c:>{max(8, len(c))}}" for c in COLUMNS), flush=True)
    with contextlib.ExitStack() as stack:
        url, log = args.url.rstrip("/"), None
        if args.serve is not None:
            log = Path(args.json).with_suffix(".server.log") if args.json else Path("serve-bench.server.log")
            report["server_log"] = str(log)
            url = stack.enter_context(serving([sys.executable, "cli.py", "serve", *shlex.split(args.serve)], log,
                                              args.start_timeout))
        report["url"] = url
        asyncio.run(measure(args, url, report, log))
    report["complete"] = True
    save(report, args.json)
    return report


if __name__ == "__main__":
    main()
