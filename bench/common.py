"""What the benchmark scripts share: the model they time and how they report."""

from __future__ import annotations

import faulthandler
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.random_model import build_random_model
from morph.api import MorphTTS
from morph.lines.text_split import MAX_SEGMENT_CHARS
from morph.settings import runs_lean

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_WORDS = "we should leave before the rain comes back and the road floods again tonight "
HELD_FRAMES = 1000  # EOS held back this long in a mixed-length run: past every row's own limit


def mixed_texts(n: int) -> list[str]:
    """n texts of 1 to 29 characters (a fixed draw): with no max_new_tokens and EOS held back, each row ends at its
    own frame limit, the engine's default for its text, about 5.4 to 15.2 s: a script's spread of line lengths."""
    rng = np.random.default_rng(0)
    return [_WORDS[:int(rng.integers(1, 30))].strip() or "we" for _ in range(n)]


def script_lines(n: int) -> list[tuple[str, int]]:
    """n lines of a realistic script (a fixed draw): (text, the frame its speech ends at). Durations from 1 to 15 s,
    log-uniform (dialogue is mostly short lines), about 14 characters a second of text, and each line spoken at its
    own rate (0.8-1.2x), so where it ends is not where its text length says: as with real speech, which ends at
    EOS well before the text-derived frame limit that batches are sorted by."""
    rng = np.random.default_rng(1)
    lines = []
    for i in range(n):
        seconds = float(np.exp(rng.uniform(np.log(1.0), np.log(15.0))))
        chars = max(2, int(round(14 * seconds)))
        text = (f"{i} " + _WORDS * (chars // len(_WORDS) + 1))[:chars].strip()
        lines.append((text, max(1, int(round(seconds * 12.5 * rng.uniform(0.8, 1.2))))))
    return lines


def skewed_lines(n: int) -> list[tuple[str, int]]:
    """n lines of a skewed script (a fixed draw), as script_lines gives them: one line of a minute in every 64 (at
    least one), the rest 1 to 5 s, log-uniform. A static batch waits for its minute-long row; the ideal schedule
    takes the longest line's time alone, or every row-frame at the full width, whichever is longer."""
    rng = np.random.default_rng(2)
    lines = []
    for i in range(n):
        seconds = 60.0 if i % 64 == 0 else float(np.exp(rng.uniform(np.log(1.0), np.log(5.0))))
        # one segment at most (bench.batch's decode-only pass takes no split text); its frame limit stays past 60 s
        chars = min(MAX_SEGMENT_CHARS - 20, max(2, int(round(14 * seconds))))
        text = (f"{i} " + _WORDS * (chars // len(_WORDS) + 1))[:chars].strip()
        lines.append((text, max(1, int(round(seconds * 12.5)))))
    return lines


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


def project_commit() -> dict:
    """The commit the run is made from, and the tracked files that differ from it. The device's copy of the
    tree has no .git, so tools/bench_gpu.sh passes what it recorded here in PROJECT_COMMIT and
    PROJECT_CHANGES; elsewhere git answers."""
    if os.environ.get("PROJECT_COMMIT"):
        return dict(commit=os.environ["PROJECT_COMMIT"],
                    uncommitted_changes=os.environ.get("PROJECT_CHANGES", "").split())
    root = Path(__file__).resolve().parent.parent

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout

    try:
        return dict(commit=git("rev-parse", "HEAD").strip(),
                    uncommitted_changes=[line[3:] for line in git("status", "--porcelain", "--untracked-files=no")
                                         .splitlines()])
    except (OSError, subprocess.CalledProcessError):
        return dict(commit=None, uncommitted_changes=None)


def model_dims(tts: MorphTTS) -> dict:
    talker = tts.tts.model.config.talker_config
    cp = talker.code_predictor_config
    return dict(talker_hidden=talker.hidden_size, talker_layers=talker.num_hidden_layers,
                predictor_hidden=cp.hidden_size, predictor_layers=cp.num_hidden_layers,
                code_groups=talker.num_code_groups,
                parameters_m=round(sum(p.numel() for p in tts.tts.model.parameters()) / 1e6, 1))


def ran_batching(tts: MorphTTS) -> str:
    """How a render batches in the mode `tts` is set to, as a report's `batching` names it: on the engine's
    continuous batch in every mode but eager, in static batches in eager (the exact reference)."""
    return "continuous" if runs_lean(tts) else "static"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def run_info(device: torch.device) -> dict:
    """What every report starts with: the project commit, the device and the versions that shape the numbers."""
    import transformers

    return dict(project_commit(), device=device_name(device), torch=torch.__version__,
                transformers=transformers.__version__, python=platform.python_version())


def stacks_on_timeout() -> None:
    """On SIGTERM, what `timeout` sends a device step that runs out of time, print every thread's Python stack to
    stderr before the process ends: the log then says where the step was, even inside a call that never returned."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def save(report: dict, json_path: str | None) -> None:
    """Write the report to json_path, when one is given. Benchmarks also save what they have after each row,
    so a run stopped by a time limit keeps the rows it finished (`complete` says whether it got to the end)."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2))


def emit(report: dict, json_path: str | None) -> dict:
    """Print the report as JSON, and write it to json_path too when one is given."""
    print(json.dumps(report, indent=2))
    save(report, json_path)
    return report
