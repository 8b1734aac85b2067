"""Serve speech over HTTP: an OpenAI-compatible POST /v1/audio/speech that streams audio as it is made, with saved
voices. Needs the optional extra: pip install "fastapi>=0.110" "uvicorn>=0.29" python-multipart
"websockets>=13".

    python cli.py serve --model Qwen/Qwen3-TTS-12Hz-0.6B-Base
    curl -s http://127.0.0.1:8000/v1/audio/speech -H 'Content-Type: application/json' \\
         -d '{"input": "Hello there.", "voice": "alice", "response_format": "pcm"}' > hello.pcm
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from cli_common import OUTPUT_DIR, CliError, Parser, add_generation_options, add_model_options, check_model, guarded, \
    load_model, settings_from
from morph.settings import LIVE_MAX_FRAMES, LIVE_MAX_PROMPT, LIVE_WIDTH

API_KEY_ENV = "MORPH_API_KEY"



def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="cli.py serve", usage="python cli.py serve [options]", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 serves other machines too "
                                                       "(set --api-key then)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--voices", type=Path, default=OUTPUT_DIR / "voices",
                   help="folder of saved voices (NAME.safetensors, as cli.py voice save and the Save Voice node write "
                        "them); POST /v1/audio/voices adds to it")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"the Bearer key every route but /health asks for; default: ${API_KEY_ENV}, else none")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds requests in flight get to finish after SIGTERM or SIGINT (GET /health answers 503 "
                        "draining, new requests 503); the rest are then cut off with an error and the process exits 0")
    p.add_argument("--batch-size", type=int, default=LIVE_WIDTH,
                   help="rows decoded together: requests (and a long text's segments) in flight at once; each row "
                        "holds its own key/value cache, so memory grows with it")
    more = p.more()
    more.add_argument("--max-frames", type=int, default=LIVE_MAX_FRAMES,
                      help="the most frames of one segment (12.5 a second); a request's max_new_tokens may not exceed it")
    more.add_argument("--max-prompt", type=int, default=LIVE_MAX_PROMPT,
                      help="the most prompt tokens of one segment (text, a voice's transcript and reference)")
    more.add_argument("--max-waiting", type=int, default=None,
                      help="rows queued for a slot before new requests get 503 with Retry-After; default 4x --batch-size")
    more.add_argument("--kv-cache-gib", type=float, default=None,
                      help="keep the talker's keys and values in a paged pool of this many GiB: rows join while their "
                           "pages can be set aside, so --batch-size can be large while memory follows the speech in "
                           "flight (new: not yet run on a GPU); default: each row holds its whole cache")
    more.add_argument("--model-name", default=None, help="the id GET /v1/models reports; default: the model's name")
    more.add_argument("--mode", default="auto", choices=["auto", "fused", "graphs", "lean"],
                      help="decode path: auto is fused on CUDA and lean elsewhere (the server runs the continuous batch, "
                           "which runs the lean layers; eager is not served)")
    add_model_options(p)
    add_generation_options(p, seed_help="the seed of requests that send none; without it every request is a new "
                                        "take", audio_out=False)
    return p


def run(args: argparse.Namespace) -> int:
    check_model(args)
    try:
        import uvicorn  # noqa: F401 (run_server's, checked before the model loads)
        import websockets  # noqa: F401 (uvicorn's for WS /v1/audio/speech/stream, which it refuses without)

        from morph.serve.app import create_app
        from morph.serve.lifecycle import run_server
    except ImportError as e:
        raise CliError(f"cli.py serve needs the server's packages ({e.name} is missing): pip install -r "
                       "requirements.txt \"fastapi>=0.110\" \"uvicorn>=0.29\" python-multipart "
                       "\"websockets>=13\"") from None
    for flag, value in (("--batch-size", args.batch_size), ("--max-frames", args.max_frames),
                        ("--max-prompt", args.max_prompt), ("--port", args.port)):
        if value < 1:
            raise CliError(f"{flag} must be >= 1, got {value}")
    if args.kv_cache_gib is not None and not args.kv_cache_gib > 0:
        raise CliError(f"--kv-cache-gib must be > 0, got {args.kv_cache_gib}")
    if not 0 <= args.shutdown_timeout < float("inf"):
        raise CliError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    settings = settings_from(args)
    app = create_app(functools.partial(load_served, args), args.voices, api_key=args.api_key,
                     model_id=args.model_name, defaults=settings,
                     width=args.batch_size, max_frames=args.max_frames, max_prompt=args.max_prompt,
                     max_waiting=args.max_waiting,
                     kv_cache_bytes=None if args.kv_cache_gib is None else int(args.kv_cache_gib * 2**30))
    print(f"serving {args.model} on http://{args.host}:{args.port} (voices in {args.voices}); "
          "GET /health says when it is warm", file=sys.stderr)
    return run_server(app, args.host, args.port, args.shutdown_timeout)  # 0 once drained; a failed engine exits 1


def load_served(args: argparse.Namespace):
    """The model, in the engine's process (morph/engine/process.py)."""
    from morph.settings import runs_lean

    tts = load_model(args, args.mode)
    if not runs_lean(tts):  # auto on a CPU: the lean layers in torch
        tts.patch.mode = "lean"
    return tts


def main(argv=None) -> int:
    return guarded(run, build_parser().parse_args(argv))
