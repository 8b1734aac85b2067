"""The test commands are the ones that exist: CI (.ci/run) runs exactly the README's, and the quick subset that
docs/development.md adds is an option of the same script, refused when mistyped before it builds anything."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def commands_of(page: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.strip().startswith("bash tools/test.sh")]


def test_ci_runs_exactly_the_readmes_test_command_and_the_quick_one_is_documented():
    assert commands_of("README.md") == ["bash tools/test.sh"]
    assert commands_of("docs/development.md") == ["bash tools/test.sh", "bash tools/test.sh --quick"]
    assert (ROOT / ".ci/run").read_text(encoding="utf-8").strip().endswith("exec bash tools/test.sh")


def test_a_mistyped_option_is_refused_before_anything_is_built():
    run = subprocess.run(["bash", "tools/test.sh", "--quik"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and run.stderr == "usage: bash tools/test.sh [--quick]\n" and run.stdout == ""
