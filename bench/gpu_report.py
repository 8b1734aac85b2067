"""One JSON and a summary table from the parts tools/bench_gpu.sh wrote (a GPU device call returns few files).

    python -m bench.gpu_report PARTS_DIR OUT.json

PARTS_DIR holds STEP.status for every step run (how it ended), STEP.json for the steps in PARTS
that got as far as writing their report, and gpu.txt (nvidia-smi's line). OUT.json: the project
commit, device and versions once at the top, how each step ended, then every part as its step
wrote it, a part that wrote nothing as {"error": how its step ended}. Standard library only, so it
runs whatever failed before it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PARTS = ("speed", "batch", "faster", "faster_batch", "first_call")
HEAD = ("commit", "uncommitted_changes", "device", "torch", "transformers", "python")


def merge(parts_dir: str | os.PathLike) -> dict:
    parts_dir = Path(parts_dir)
    steps = {path.stem: path.read_text().strip() for path in sorted(parts_dir.glob("*.status"))}
    parts = {}
    for name in PARTS:
        path = parts_dir / f"{name}.json"
        parts[name] = json.loads(path.read_text()) if path.exists() else {"error": steps.get(name, "did not run")}
    head = next(({k: p[k] for k in HEAD if k in p} for p in parts.values() if "commit" in p), {})
    gpu = parts_dir / "gpu.txt"
    return dict(head, gpu=gpu.read_text().strip() if gpu.exists() else None,
                allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "native", steps=steps, parts=parts)


def _section(out: list, parts: dict, names, label, cells) -> None:
    """One table of the summary: a line per result row of each named part, its label, then its cells."""
    for name in names:
        part = parts[name]
        if "results" not in part:
            out.append(f"  {name}: {part['error']}")
            continue
        for row in part["results"]:
            if "error" in row:
                out.append(f"  {label(part, row):52} ERROR {row['error'][:120]}")
                continue
            ran = f" ran {row['ran_as']}" if row.get("ran_as") else ""
            out.append(f"  {label(part, row):52} {cells(row)}{ran}")
        out += _stopped(name, part)


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _stopped(name: str, part: dict) -> list[str]:
    return [f"  {name}: stopped before the end; the rows above are the ones it finished"] \
        if part.get("complete") is False else []


def summary(report: dict) -> str:
    """Plain-text tables: one line, batch, first call; a part that failed shows its error."""
    parts = report["parts"]
    out = [f"commit {report.get('commit')}  {report.get('device')}  torch {report.get('torch')}  "
           f"transformers {report.get('transformers')}  allocator {report.get('allocator')}"]
    out.append("\none line, batch 1: ms/frame decode only | end to end, x real time end to end, peak GiB end to end")
    _section(out, parts, ("speed", "faster"),
             lambda part, row: f"{row['stack']} ({row.get('prompt')}, {part.get('frames')} frames)",
             lambda row: f"{_num(row['ms_per_frame']):>8} | {_num(row['end_to_end_ms_per_frame']):>8}"
                         f" {_num(row['end_to_end_x_real_time'], 1):>7}x {_num(row['end_to_end_peak_memory_gib'], 3):>7}")
    out.append("\nbatch: seconds of audio per wall second, decode only | end to end, peak GiB end to end")
    _section(out, parts, ("batch", "faster_batch"),
             lambda part, row: f"{row.get('stack') or 'morph ' + row['mode']} k={row['seq_groups']} "
                               f"batch {row['batch_size']}",
             lambda row: f"{_num(row['x_real_time'], 1):>8} | {_num(row['end_to_end_x_real_time'], 1):>8}"
                         f" {_num(row['end_to_end_peak_memory_gib'], 3):>7}")
    out.append("\nfirst call of a fresh process: seconds to load, make the voice, speak the line; whole process")
    part = parts["first_call"]
    for row in part.get("first_call", []):
        label = f"{row['mode']} ({row['caches']} caches)"
        if "error" in row:
            out.append(f"  {label:30} ERROR {row['error'][-200:]}")
            continue
        out.append(f"  {label:30} load {_num(row['load_s'], 1)}  voice {_num(row['voice_s'], 1)}  "
                   f"first line {_num(row['first_generation_s'], 1)} (ran {row['ran_as']})  "
                   f"process {_num(row['process_s'], 1)}  cache files at start {row['cache_files_at_start']}")
    if "first_call" not in part:
        out.append(f"  {part['error']}")
    out.append("\nsteps: " + "; ".join(f"{name} {ended}" for name, ended in report["steps"].items()))
    return "\n".join(out)


def main(argv=None) -> dict:
    parts_dir, out = (argv or sys.argv[1:])[:2]
    report = merge(parts_dir)
    Path(out).write_text(json.dumps(report, indent=1))
    print(summary(report))
    return report


if __name__ == "__main__":
    main()
