"""tools/serve_gpu.sh and the wheels it carries (tools/device_wheels/common.txt [serve]): the script parses, and the
section brings what the speech server imports that the device lacks, so that the offline install on the GPU machine
(--no-deps) starts `cli.py serve`. The run itself is checked by running it on the device."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tools.comfy_gpu import wheels

ROOT = Path(__file__).resolve().parents[2]
# the device: CPython 3.12 on x86-64 Linux
DEVICE_MARKERS = dict(python_version="3.12", python_full_version="3.12.3", sys_platform="linux", platform_system="Linux",
                      platform_machine="x86_64", os_name="posix", implementation_name="cpython",
                      platform_python_implementation="CPython", extra="")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_script_parses():
    done = subprocess.run(["bash", "-n", str(ROOT / "tools" / "serve_gpu.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_serve_wheels_bring_what_the_server_needs_and_the_device_lacks():
    serve = {norm(s.split("==")[0]): s.split("==")[1] for s in wheels.manifest_for("0.8.0")["serve"]}
    assert "serve" in wheels.OPTIONAL, "fetched only when named, never into a ComfyUI server's folder"
    device = {norm(line.split("==")[0]) for line in (ROOT / "tests" / "fixtures" / "device_packages.txt").read_text()
              .splitlines() if line and not line.startswith("#")}
    assert not set(serve) & device, "carried wheels would replace the device's own packages"
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    assert {norm(Requirement(r).name) for r in extra} <= set(serve)
    # what each carried package requires, as installed here (the test venv has the server's packages)
    for name in serve:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed here: its requirements cannot be read")
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(DEVICE_MARKERS):
                assert norm(req.name) in device or norm(req.name) in serve, \
                    f"{name} needs {req.name}: neither on the device nor in [serve]"
