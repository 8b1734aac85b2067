"""tools/gpu_check_parts.sh in a tree of its own, where tools/gpu_check.sh is a stand-in that records how it was called
and reports as the real one does: every part runs under both allocators side by side, a failure or a part stopped at
its limit makes the exit non-zero, and everything comes back as one archive. The real runs are on the device."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The stand-in: writes what it was asked into OUTDIR/asked.json and a report like tools/gpu_check.sh's; a TESTS that
# names test_failures.py fails one test, and one that names test_slow sleeps past any limit.
STAND_IN = r"""#!/usr/bin/env bash
out=$1; mkdir -p "$out"
case "$TESTS" in *test_slow*) sleep 30;; esac
failed='[]'; case "$TESTS" in *test_failures*) failed='["tests.gpu.test_failures::x"]';; esac
printf '{"backends": "%s", "tests": "%s"}' "$BACKENDS" "$TESTS" > "$out/asked.json"
printf '{"commit": "c", "backends": {"%s": {"passed": 2, "failed": %s, "seconds": 1}}}' "$BACKENDS" "$failed" \
  > "$out/gpu_check.json"
"""


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "gpu_check_parts.sh", tmp_path / "tools")
    (tmp_path / "tools" / "gpu_check.sh").write_text(STAND_IN)
    (tmp_path / ".whl" / "gpu").mkdir(parents=True)
    (tmp_path / ".whl" / "gpu" / "COMMIT").write_text("abcdef0123\n")
    (tmp_path / "site").mkdir()
    return tmp_path


def run(tree: Path, *parts: str, limit: int = 20):
    # /tmp/gpu-site exists wherever the wheels were installed once; here nothing is installed
    script = (tree / "tools" / "gpu_check_parts.sh").read_text().replace("/tmp/gpu-site", str(tree / "site"))
    (tree / "tools" / "gpu_check_parts.sh").write_text(script)
    done = subprocess.run(["bash", str(tree / "tools" / "gpu_check_parts.sh"), str(tree / "out"), *parts],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "LIMIT": str(limit)})
    return done


def unpacked(tree: Path) -> dict[str, dict]:
    with tarfile.open(tree / "out" / "tests-abcdef0.tgz") as archive:
        archive.extractall(tree / "unpacked", filter="data")
    return {p.parent.name: json.loads(p.read_text()) for p in (tree / "unpacked" / "tests-abcdef0").glob("*/asked.json")}


def test_each_part_runs_under_both_allocators_into_one_archive(tree):
    done = run(tree, "A", "M5")
    assert done.returncode == 0, done.stdout + done.stderr
    asked = unpacked(tree)
    assert set(asked) == {"A-cudaMallocAsync", "A-native", "M5-cudaMallocAsync", "M5-native"}
    assert asked["M5-native"] == {"backends": "native", "tests": "tests/gpu/test_memory.py -k 5s"}
    assert asked["A-cudaMallocAsync"]["tests"].split()[0] == "tests/gpu/test_continuous.py"
    assert not (tree / "out" / "tests-abcdef0").exists(), "only the archive comes back"
    assert "M5   native          2 passed, 0 failed, 1 s" in done.stdout


def test_no_part_named_runs_them_all(tree):
    assert run(tree).returncode == 1  # part B holds test_failures.py, which the stand-in fails
    assert {name.rsplit("-", 1)[0] for name in unpacked(tree)} == {"A", "B", "C", "M5", "M60"}


def test_a_failed_test_fails_the_run_and_names_it(tree):
    done = run(tree, "B")
    assert done.returncode == 1
    assert "B    native          2 passed, 1 failed, 1 s tests.gpu.test_failures::x" in done.stdout


def test_a_part_stopped_at_its_limit_is_said_and_fails_the_run(tree):
    script = (tree / "tools" / "gpu_check_parts.sh").read_text()
    (tree / "tools" / "gpu_check_parts.sh").write_text(script.replace('[M60]="tests/gpu/test_memory.py -k 60s"',
                                                                      '[M60]="tests/gpu/test_slow.py"'))
    done = run(tree, "M60", limit=2)
    assert done.returncode == 1
    assert "M60 native: no result (stopped at 2 s" in done.stdout


def test_an_unknown_part_is_refused(tree):
    done = run(tree, "Z")
    assert done.returncode == 2
    assert "unknown part Z" in done.stderr
