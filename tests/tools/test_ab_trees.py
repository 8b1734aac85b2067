"""tools/ab_trees.sh on a repository of its own: each tree runs its own `morph`, even with the project's root on
PYTHONPATH, in the order asked, its output where `{json}` says, named for its tree and round."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "ab_trees.sh"
# prints the `morph` it imported, as `python -m bench.batch` would import it
CMD = [sys.executable, "-c", "import json, sys, morph; json.dump(dict(version=morph.VERSION), open(sys.argv[1], 'w'))",
       "{json}"]


def commit(repo: Path, version: str) -> str:
    (repo / "morph").mkdir(exist_ok=True)
    (repo / "morph" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    for folder in ("bench", "postprocess"):
        (repo / folder).mkdir(exist_ok=True)
        (repo / folder / "__init__.py").write_text("")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", version], check=True)
    return subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_each_tree_runs_its_own_morph_in_turns(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "tools").mkdir()
    shutil.copy(TOOL, repo / "tools")
    first, second = commit(repo, "1"), commit(repo, "2")
    (repo / "morph" / "__init__.py").write_text("VERSION = 'work'\n")  # the working tree, not committed
    tool = ["bash", str(repo / "tools" / "ab_trees.sh")]
    subprocess.run([*tool, "prepare", first, second], check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=str(repo))  # the trap: the project's root on the path
    done = subprocess.run([*tool, "run", str(tmp_path / "out"), "2", "work", first, second, "--", *CMD],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ran = [line.split(":")[0] for line in done.stdout.splitlines()]
    assert ran == [f"{t}-{r}" for r in (1, 2) for t in ("work", first, second)]
    versions = {name: json.loads((tmp_path / "out" / f"{name}.json").read_text())["version"] for name in ran}
    assert versions == {f"{t}-{r}": v for r in (1, 2) for t, v in (("work", "work"), (first, "1"), (second, "2"))}


def test_a_tree_not_prepared_is_named_with_the_fix(tmp_path):
    done = subprocess.run(["bash", str(TOOL), "run", str(tmp_path / "out"), "1", "0123abc", "--", "true"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "bash tools/ab_trees.sh prepare 0123abc" in done.stderr
