"""tools/compare_gpu.sh without a GPU: the script parses, and every bench it runs on the device accepts the arguments
it is given (a typo there would cost a whole device call). The run itself is checked by running it on the device."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "compare_gpu.sh"
VARIABLES = {"$model": "/tmp/model-0.6b", "$out": "/tmp/out", "$status_dir": "/tmp/status"}


def device_commands() -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python3 -m bench.X ...` the script runs, its continued lines joined."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = []
    for module, rest in re.findall(r"python3 -m (bench\.\w+) ([^\n]*)", text):
        for name, value in VARIABLES.items():
            rest = rest.replace(f'"{name}', f'"{value}').replace(name, value)
        found.append((module, shlex.split(rest.split("||")[0])))
    return found


class Parsed(Exception):
    pass


def test_the_script_parses():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_it_runs_the_comparisons_benches_the_peers_before_upstreams_slow_line():
    assert [module for module, _ in device_commands()] == ["bench.random_model", "bench.batch_faster", "bench.batch",
                                                          "bench.speed", "bench.compare"]


@pytest.mark.parametrize("module, args", device_commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_each_bench_accepts_its_arguments(module, args, monkeypatch):
    """Each module's own parser reads the arguments, and the run stops right after (nothing is loaded)."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        raise Parsed(original(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module, *args])  # bench.random_model reads sys.argv
    main = importlib.import_module(module).main
    with pytest.raises(Parsed) as parsed:
        main() if module == "bench.random_model" else main(args)
    assert vars(parsed.value.args[0])
