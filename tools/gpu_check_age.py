"""Which commit the GPU checks (tests/gpu, `bash tools/gpu_check.sh` on an NVIDIA GPU) last ran at, with what result,
and how many commits to the engine (morph/, nodes/) came after it, and where the tests/gpu files that check did not run
last ran: CI has no GPU, so its own summary only lists those tests as skipped, and this line says how old the evidence
for them is.

    python tools/gpu_check_age.py      # prints one line; never fails (a CI without git history still runs)
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ("morph", "nodes")


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except OSError:  # no git on this machine: nothing is known, and CI goes on
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def checks(results: Path) -> list[dict]:
    """Every committed GPU check report (gpu_check.json, or gpu_check_<allocator>.json where the allocators ran in
    calls of their own; a part of the tests in a folder of its own), at any depth, with how many commits HEAD is past
    its commit (None where git does not know the commit): the fewest is the newest, whatever the clock said."""
    found = []
    for path in sorted(results.rglob("gpu_check*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if report.get("commit"):
            behind = git("rev-list", "--count", f"{report['commit']}..HEAD")
            found.append(dict(report, path=path, behind=int(behind) if behind else None))
    return found


def ran(report: dict) -> set[str] | None:
    """The tests/gpu files a report's run named (tools/gpu_check.sh TESTS), or None where it ran them all."""
    paths = [t.rstrip("/") for t in report.get("tests", "tests/gpu").split() if t.startswith("tests/gpu")]
    return None if "tests/gpu" in paths else {Path(t).name for t in paths}


def gpu_files() -> set[str]:
    """The tests/gpu files as HEAD has them."""
    return {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}


def summary(report: dict) -> str:
    """Each allocator's counts, and the tests/gpu files (as HEAD has them) none of its parts ran."""
    every = gpu_files()
    parts = []
    for backend, result in report.get("backends", {}).items():
        failed = len(result.get("failed", []))
        missed = sorted(every - result["ran"]) if result.get("ran") is not None else []
        left = f" ({', '.join(missed)} not run)" if missed else ""
        parts.append(f"{backend} {result.get('passed', 0)} passed, {failed} failed{left}")
    return "; ".join(parts) or "no result recorded"


def last_ran(files: set[str], known: list[dict]) -> str:
    """Where each of `files` last ran at older code: the newest check that ran it, by commit, with the commits to the
    engine since; ' never' for a file no check ran."""
    at: dict[str, list[str]] = {}
    for name in sorted(files):
        runs = [c for c in known if (named := ran(c)) is None or name in named]
        at.setdefault(min(runs, key=lambda c: c["behind"])["commit"] if runs else "", []).append(name)
    parts = []
    for commit_id, names in sorted(at.items(), key=lambda item: item[0] == ""):
        if not commit_id:
            parts.append(f"{', '.join(names)} never")
            continue
        after = git("rev-list", "--count", f"{commit_id}..HEAD", "--", *ENGINE)
        parts.append(f"{', '.join(names)} at {commit_id[:10]} ({after} commits to {' and '.join(ENGINE)} since)")
    return "; ".join(parts)


def code(commit: str) -> tuple[str | None, ...]:
    """What the GPU checks test at a commit: its trees of the engine and of tests/gpu."""
    return tuple(git("rev-parse", f"{commit}:{path}") for path in (*ENGINE, "tests/gpu"))


def main() -> int:
    known = [c for c in checks(ROOT / "bench" / "results") if c["behind"] is not None]
    if not known:
        print("GPU checks: none committed at a commit this clone knows")
        return 0
    newest = min(known, key=lambda c: c["behind"])
    # A check's parts may have run at several commits that test the same code (a results commit between calls), its
    # allocators in a file each, an allocator's tests in parts (tools/gpu_check.sh TESTS): together they are its
    # result. A part run again at a later commit of the same code counts once, as it ran last.
    codes = {commit: code(commit) for commit in {c["commit"] for c in known}}  # many reports share a commit
    same = [c for c in known if codes[c["commit"]] == codes[newest["commit"]]]
    at, counted = [], set()
    for _, group in itertools.groupby(sorted(same, key=lambda c: c["behind"]), key=lambda c: c["behind"]):
        group = list(group)
        for c in group:
            parts = {b: r for b, r in c.get("backends", {}).items() if (c.get("tests"), b) not in counted}
            if parts:
                at.append(dict(c, backends=parts))
        counted |= {(c.get("tests"), b) for c in group for b in c.get("backends", {})}
    backends: dict[str, dict] = {}
    for c in at:
        for backend, result in c["backends"].items():
            total = backends.setdefault(backend, dict(passed=0, failed=[], ran=set()))
            total["passed"] += result.get("passed", 0)
            total["failed"] += result.get("failed", [])
            files = ran(c)
            total["ran"] = None if files is None or total["ran"] is None else total["ran"] | files
    older = sorted({c["commit"][:10] for c in at} - {newest["commit"][:10]})
    also = f" (with {', '.join(older)}: the same {', '.join(ENGINE)} and tests/gpu)" if older else ""
    after = git("rev-list", "--count", f"{newest['commit']}..HEAD", "--", *ENGINE)
    paths = ", ".join(str(c["path"].relative_to(ROOT)) for c in at)
    missed = set().union(*(gpu_files() - r["ran"] for r in backends.values() if r["ran"] is not None))
    earlier = f". Not run there, last run: {last_ran(missed, known)}" if missed else ""
    print(f"GPU checks last ran at {newest['commit'][:10]}{also} on {newest.get('device', 'an unnamed GPU')} "
          f"({paths}): {summary(dict(newest, backends=backends))}; "
          f"{after if after is not None else 'an unknown number of'} commits to {' and '.join(ENGINE)} since{earlier}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
