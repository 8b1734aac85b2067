"""tools/gpu_check_age.py on a repository of its own: the newest committed GPU check, its result, the engine commits
after it, and where the tests/gpu files it did not run last ran."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import gpu_check_age  # noqa: E402


def commit(repo, path, text):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", path], check=True)
    subprocess.run([*git, "commit", "-qm", path], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def repo_with_gpu_tests(repo, *names):
    """A new repository whose tests/gpu holds these files."""
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for name in names:
        commit(repo, f"tests/gpu/{name}", "")


def check(commit_id, failed=(), backends=("cudaMallocAsync", "native"), tests=None):
    results = dict(cudaMallocAsync=dict(passed=3, failed=list(failed)), native=dict(passed=2, failed=[]))
    report = dict(commit=commit_id, device="GPU X", backends={b: results[b] for b in backends})
    return json.dumps(report if tests is None else dict(report, tests=tests))


def test_the_newest_check_its_result_and_the_engine_commits_since(tmp_path, monkeypatch, capsys):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    old = commit(tmp_path, "morph/a.py", "1")
    new = commit(tmp_path, "nodes/b.py", "1")
    commit(tmp_path, "bench/results/d1/gpu_check-old/gpu_check.json", check(old))
    # the newest ran its allocators in a call each, one folder deeper: one check
    commit(tmp_path, "bench/results/d2/final/gpu_check_cudaMallocAsync.json",
           check(new, failed=["t::x"], backends=["cudaMallocAsync"]))
    commit(tmp_path, "bench/results/d2/final/gpu_check_native.json", check(new, backends=["native"]))
    # ... and the rest of its cudaMallocAsync tests in a call of their own (tools/gpu_check.sh TESTS)
    commit(tmp_path, "bench/results/d2/final2/gpu_check.json", check(new, backends=["cudaMallocAsync"]))
    commit(tmp_path, "bench/results/d2/gpu_check-lost/gpu_check.json", check("0" * 40))  # a commit not here
    commit(tmp_path, "morph/a.py", "2")
    commit(tmp_path, "README.md", "not the engine")
    commit(tmp_path, "nodes/b.py", "2")
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    assert gpu_check_age.main() == 0
    assert capsys.readouterr().out.strip() == (
        f"GPU checks last ran at {new[:10]} on GPU X (bench/results/d2/final/gpu_check_cudaMallocAsync.json, "
        "bench/results/d2/final/gpu_check_native.json, bench/results/d2/final2/gpu_check.json): "
        "cudaMallocAsync 6 passed, 1 failed; native 2 passed, 0 failed; 2 commits to morph and nodes since")


def test_a_clone_without_checks_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    assert gpu_check_age.main() == 0
    assert "none committed" in capsys.readouterr().out


def test_a_machine_without_git_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "bench/results/d1").mkdir(parents=True)
    (tmp_path / "bench/results/d1/gpu_check.json").write_text(check("1" * 40))
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no git to be found
    assert gpu_check_age.main() == 0
    assert "none committed" in capsys.readouterr().out


def test_a_check_run_in_parts_names_the_files_no_part_ran(tmp_path, monkeypatch, capsys):
    repo_with_gpu_tests(tmp_path, "test_a.py", "test_b.py", "test_c.py")
    head = commit(tmp_path, "morph/a.py", "1")
    # cudaMallocAsync ran a and b in one part and c (selected with -k) in another; native ran only a
    commit(tmp_path, "bench/results/d/A-async/gpu_check.json",
           check(head, backends=["cudaMallocAsync"], tests="tests/gpu/test_a.py tests/gpu/test_b.py"))
    commit(tmp_path, "bench/results/d/M-async/gpu_check.json",
           check(head, backends=["cudaMallocAsync"], tests="tests/gpu/test_c.py -k 60s"))
    commit(tmp_path, "bench/results/d/A-native/gpu_check.json",
           check(head, backends=["native"], tests="tests/gpu/test_a.py"))
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    assert gpu_check_age.main() == 0
    out = capsys.readouterr().out
    assert "cudaMallocAsync 6 passed, 0 failed; native 2 passed, 0 failed (test_b.py, test_c.py not run)" in out


@pytest.mark.parametrize("parts, missed", [
    ([None], ""),  # no TESTS: the whole of tests/gpu
    (["tests/gpu/"], ""),
    (["tests/gpu"], ""),
    ([None, "tests/gpu/test_a.py"], ""),  # a whole run, then a part again: still the whole
    (["tests/gpu/test_a.py", None], ""),
    (["-k slow"], " (test_a.py, test_b.py not run)"),  # named no file of tests/gpu
])
def test_what_a_run_named_decides_the_files_not_run(tmp_path, monkeypatch, capsys, parts, missed):
    # only test_*.py files are tests
    repo_with_gpu_tests(tmp_path, "__init__.py", "conftest.py", "test_a.py", "test_b.py")
    head = commit(tmp_path, "morph/a.py", "1")
    for i, tests in enumerate(parts):
        commit(tmp_path, f"bench/results/d/part{i}/gpu_check.json", check(head, backends=["native"], tests=tests))
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    assert gpu_check_age.main() == 0
    assert f"native {2 * len(parts)} passed, 0 failed{missed}; 0 commits" in capsys.readouterr().out


def test_parts_run_at_commits_of_the_same_code_are_one_check(tmp_path, monkeypatch, capsys):
    repo_with_gpu_tests(tmp_path, "test_a.py", "test_b.py")
    before = commit(tmp_path, "morph/a.py", "1")
    commit(tmp_path, "bench/results/d0/B/gpu_check.json",  # other code: not part of the check below
           check(before, failed=["t::old"], backends=["native"], tests="tests/gpu/test_b.py"))
    first = commit(tmp_path, "morph/a.py", "2")
    commit(tmp_path, "bench/results/d1/A/gpu_check.json",
           check(first, failed=["t::x"], backends=["cudaMallocAsync"], tests="tests/gpu/test_a.py"))
    commit(tmp_path, "bench/results/d1/B/gpu_check.json",
           check(first, backends=["cudaMallocAsync"], tests="tests/gpu/test_b.py"))
    # a results commit, then part A again at it, now passing: it counts, the older A does not
    last = commit(tmp_path, "bench/results/d1/NOTES.md", "notes")
    commit(tmp_path, "bench/results/d2/A/gpu_check.json",
           check(last, backends=["cudaMallocAsync"], tests="tests/gpu/test_a.py"))
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    assert gpu_check_age.main() == 0
    assert capsys.readouterr().out.strip() == (
        f"GPU checks last ran at {last[:10]} (with {first[:10]}: the same morph, nodes and tests/gpu) on GPU X "
        "(bench/results/d2/A/gpu_check.json, bench/results/d1/B/gpu_check.json): "
        "cudaMallocAsync 6 passed, 0 failed; 0 commits to morph and nodes since")


def test_the_files_the_newest_check_did_not_run_say_where_they_last_ran(tmp_path, monkeypatch, capsys):
    repo_with_gpu_tests(tmp_path, "test_a.py", "test_b.py", "test_c.py")
    old = commit(tmp_path, "morph/a.py", "1")
    commit(tmp_path, "bench/results/d0/all/gpu_check.json",
           check(old, backends=["native"], tests="tests/gpu/test_b.py"))
    older_b = commit(tmp_path, "morph/a.py", "2")
    commit(tmp_path, "bench/results/d1/b/gpu_check.json", check(older_b, backends=["native"],
                                                                tests="tests/gpu/test_b.py"))
    head = commit(tmp_path, "morph/a.py", "3")
    commit(tmp_path, "bench/results/d2/a/gpu_check.json", check(head, backends=["native"], tests="tests/gpu/test_a.py"))
    monkeypatch.setattr(gpu_check_age, "ROOT", tmp_path)
    assert gpu_check_age.main() == 0
    assert capsys.readouterr().out.strip().endswith(
        "(test_b.py, test_c.py not run); 0 commits to morph and nodes since. Not run there, last run: "
        f"test_b.py at {older_b[:10]} (1 commits to morph and nodes since); test_c.py never")
