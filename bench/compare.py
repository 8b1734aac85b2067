"""Issue 80's comparison in one JSON: the pack beside upstream qwen-tts and the faster-qwen3-tts peers, from the
parts tools/compare_gpu.sh wrote (a GPU device call brings back at most 8 files).

    python -m bench.compare OUT STATUS_DIR

OUT holds each bench's report (PARTS: line.json, bench.speed's one line for the pack and upstream; batch.json,
bench.batch's 32 lines; faster.json and faster_batch.json, the peers') and the call's log, compare.log; STATUS_DIR
holds STEP.status (how each step ended, tools/device_steps.sh) and gpu.txt (nvidia-smi's line). OUT/compare.json
gets the run (commit, device, versions, allocator) once, how each step ended, per stack the min, median and max over
its timed runs of each figure (one line: ms a frame decode only and end to end; 32 lines: wall seconds and x real
time both ways), and per part that did not finish: how its step ended, the phase it was in and every thread's stack
at its time limit (bench.common.stacks_on_timeout, as the log holds it). Standard library only, so it runs whatever
failed before it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

# part: (the step that writes it, what it measures)
PARTS = {"line": ("line", "line"), "faster": ("peers", "line"), "batch": ("batch", "lines"),
         "faster_batch": ("peers", "lines")}
HEAD = ("commit", "uncommitted_changes", "device", "torch", "transformers", "python")
FRAMES_PER_SECOND = 12.5
STACK_LINE = re.compile(r'^(Current thread|Thread) 0x[0-9a-f]+|^  File "')


def spread(values: list[float], digits: int = 3) -> dict:
    """min, median and max of some runs' figures, and how many runs."""
    return dict(min=round(min(values), digits), median=round(statistics.median(values), digits),
                max=round(max(values), digits), runs=len(values))


def stack_name(row: dict) -> str:
    return row.get("stack") or f"morph {row['mode']} k={row['seq_groups']}"  # bench.batch's rows name their mode


def line_row(part: str, report: dict, row: dict) -> dict:
    """One stack on the line: ms a frame over its decode-only and end-to-end runs."""
    name = stack_name(row)
    # upstream and faster-qwen3-tts decode every code group of a frame in order: seq_groups 15
    out = dict(stack=name, part=f"{part}.json", seq_groups=int(name.rsplit("k=", 1)[1]) if " k=" in name else 15,
               decode_only_ms_per_frame=spread([1000 * s / row["frames"] for s in row["runs_s"]]),
               end_to_end_ms_per_frame=spread([1000 * s / row["end_to_end_frames"] for s in row["end_to_end_runs_s"]]))
    out["end_to_end_x_real_time"] = round(1000 / FRAMES_PER_SECOND / out["end_to_end_ms_per_frame"]["median"], 2)
    # warm: every timed run after the stack's first call; upstream's first run is its first call (nothing to capture)
    out.update(first_call_s=row.get("first_call_s"), timed_runs_warm=bool(row.get("warmed_up")))
    return out


def lines_row(part: str, report: dict, row: dict) -> dict:
    """One stack on the lines: wall seconds and x real time over its decode-only and end-to-end runs."""
    out = dict(stack=stack_name(row), part=f"{part}.json", seq_groups=row["seq_groups"], batch_size=row["batch_size"])
    for key, walls, audio_s in (("decode_only", row["runs_s"], row["audio_s"]),
                                ("end_to_end", row["end_to_end_runs_s"], row["end_to_end_audio_s"])):
        out[f"{key}_wall_s"] = spread(walls)
        out[f"{key}_x_real_time"] = spread([audio_s / w for w in walls], 1)
    # the untimed first end-to-end render: bench.batch --warm-up's, or the peer's first batch (its capture;
    # bench.batch's own warmup_s is its decode-only warm-up, no render)
    out["first_render_s"] = row.get("first_render_s", row.get("warmup_s") if "stack" in row else None)
    out["timed_runs_warm"] = "first_render_s" in row or report.get("warm_frames") == report.get("frames_per_line")
    return out


def log_sections(log: str) -> dict[str, list[str]]:
    """The log's lines per step (tools/device_steps.sh's `=== NAME` header to its `exit ...` line)."""
    sections, current = {}, None
    for line in log.splitlines():
        header = re.match(r"^=== (\S+)", line)
        if header:
            current = header.group(1)
            sections[current] = []
        elif line.startswith("exit "):
            current = None
        elif current is not None:
            sections[current].append(line)
    return sections


def stopped(part: str, report: dict | None, step: str, steps: dict, sections: dict) -> dict:
    """Why a part has no complete report: how its step ended, the phase it was in, and the stacks the log holds."""
    out = dict(step=steps.get(step, "did not run"))
    if report is None:
        out["report"] = "none written"
    else:
        out.update(running=report.get("running"), phases_s=report.get("phases_s"))
    out["stacks"] = [line for line in sections.get(step, []) if STACK_LINE.match(line)]
    return out


def merge(out_dir: str | os.PathLike, status_dir: str | os.PathLike) -> dict:
    out_dir, status_dir = Path(out_dir), Path(status_dir)
    steps = {path.stem: path.read_text().strip() for path in sorted(status_dir.glob("*.status"))}
    log = out_dir / "compare.log"
    sections = log_sections(log.read_text(errors="replace")) if log.exists() else {}
    reports = {}
    for part in PARTS:
        path = out_dir / f"{part}.json"
        reports[part] = json.loads(path.read_text()) if path.exists() else None
    head = next(({k: r[k] for k in HEAD if k in r} for r in reports.values() if r and "commit" in r), {})
    gpu = status_dir / "gpu.txt"
    result = dict(head, gpu=gpu.read_text().strip() if gpu.exists() else None,
                  allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "native", steps=steps,
                  packages={}, one_line=[], lines=[], not_finished={})
    for part, (step, kind) in PARTS.items():
        report = reports[part]
        if report is not None:
            result["packages"].update(report.get("packages", {}))
            for row in report.get("results", []):
                if "error" in row:
                    result["not_finished"][f"{part}: {stack_name(row)}"] = row["error"]
                elif kind == "line":
                    result["one_line"].append(line_row(part, report, row))
                else:
                    result["lines"].append(lines_row(part, report, row))
        if report is None or report.get("complete") is False:
            result["not_finished"][part] = stopped(part, report, step, steps, sections)
    return result


def summary(report: dict) -> str:
    out = [f"{report.get('device')}  commit {report.get('commit')}  torch {report.get('torch')}  "
           f"transformers {report.get('transformers')}  allocator {report['allocator']}",
           "one line: ms a frame, median [min-max], decode only | end to end"]
    for row in report["one_line"]:
        d, e = row["decode_only_ms_per_frame"], row["end_to_end_ms_per_frame"]
        out.append(f"  {row['stack']:32} {d['median']:>9.3f} [{d['min']}-{d['max']}] | "
                   f"{e['median']:>9.3f} [{e['min']}-{e['max']}]")
    out.append("32 lines: x real time, median [min-max], decode only | end to end")
    for row in report["lines"]:
        d, e = row["decode_only_x_real_time"], row["end_to_end_x_real_time"]
        out.append(f"  {row['stack']:32} {d['median']:>7.1f} [{d['min']}-{d['max']}] | "
                   f"{e['median']:>7.1f} [{e['min']}-{e['max']}]")
    for name, why in report["not_finished"].items():
        out.append(f"not finished: {name}: {why if isinstance(why, str) else json.dumps(why)[:400]}")
    out.append("steps: " + "; ".join(f"{name} {ended}" for name, ended in report["steps"].items()))
    return "\n".join(out)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the folder tools/compare_gpu.sh wrote the parts and compare.log into")
    p.add_argument("status_dir", help="the folder of its steps' STEP.status and gpu.txt")
    args = p.parse_args(argv)
    for folder in (args.out, args.status_dir):
        if not Path(folder).is_dir():
            p.error(f"{folder} is not a folder; give the call's OUT and its steps' status folder")
    report = merge(args.out, args.status_dir)
    Path(args.out, "compare.json").write_text(json.dumps(report, indent=1))
    print(summary(report))
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
