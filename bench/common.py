"""What the benchmark scripts share: the model they time and how they report."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.random_model import build_random_model
from morph.engine import MorphTTS

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def add_model_args(p) -> None:
    """The arguments load_bench_model reads: which model, on what, in which precision."""
    p.add_argument("--model", help="a checkpoint folder (real or built); default: build random weights at --size")
    p.add_argument("--size", default="tiny", choices=["tiny", "tiny-proj", "0.6b", "1.7b"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--attention", default="sdpa", choices=["auto", "sdpa", "eager", "flash_attention_2"])


def load_bench_model(args, build_into: str | None = None) -> MorphTTS:
    """args.model if given, else random weights at args.size (kept in build_into, if given)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            start = time.perf_counter()
            folder = build_random_model(build_into or tmp, args.size, "base", seed=0,
                                        dtype=DTYPES.get(args.dtype, torch.float32))
            print(f"built random {args.size} weights in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        return MorphTTS.load(str(folder), args.device, args.dtype, args.attention)


def emit(report: dict, json_path: str | None) -> dict:
    """Print the report as JSON, and write it to json_path too when one is given."""
    text = json.dumps(report, indent=2)
    print(text)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(text)
    return report
