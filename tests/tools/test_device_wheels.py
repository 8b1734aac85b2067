"""tools/comfy_gpu/wheels.py: comfy-kitchen's wheel rewritten without its ROCm library still installs with pip, as
does a large wheel rewritten with LZMA, and the wheels split into parts that each fit one device call, which the
device side finds complete or not."""

from __future__ import annotations

import base64
import hashlib
import random
import subprocess
import sys
import zipfile

import pytest

from tools.comfy_gpu import wheels

HIP = "comfy_kitchen/backends/hip/_C.abi3.so"
FILES = {"comfy_kitchen/__init__.py": b"VERSION = '0.2.31'\n", "comfy_kitchen/backends/cuda/_C.abi3.so": b"\x7fELF cuda",
         HIP: b"\x7fELF rocm" * 1000}
DIST = "comfy_kitchen-0.2.31.dist-info"


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def fake_kitchen(folder):
    """A wheel laid out as comfy-kitchen 0.2.31's: the package, its CUDA and ROCm libraries, a RECORD of them."""
    files = {**FILES, f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: comfy-kitchen\nVersion: 0.2.31\n",
             f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp312-abi3-any\n"}
    record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in files.items()) + f"{DIST}/RECORD,,\n"
    path = folder / "comfy_kitchen-0.2.31-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{DIST}/RECORD", record)
    return path


def test_the_rocm_library_is_dropped_and_the_wheel_still_installs(tmp_path):
    wheel = fake_kitchen(tmp_path)
    assert wheels.strip(wheel) > 0
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = [line.split(",") for line in z.read(f"{DIST}/RECORD").decode().splitlines()]
        # every RECORD line names a member, with its hash, and every member is in RECORD
        assert {r[0] for r in record} == names
        assert all(r[1] == digest(z.read(r[0])) for r in record if r[1])
    assert HIP not in names and "comfy_kitchen/backends/cuda/_C.abi3.so" in names
    assert wheels.strip(wheel) == 0, "a rerun rewrites nothing"
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                           "--disable-pip-version-check", "--target", str(target), str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (target / "comfy_kitchen" / "backends" / "cuda" / "_C.abi3.so").is_file()
    assert not (target / "comfy_kitchen" / "backends" / "hip").exists()


def test_rays_unused_folders_are_dropped_whole(tmp_path):
    """A folder in NOT_LOADED goes with everything under it, and only that: ray/tune/ but not ray/tuned.py."""
    dist = "ray-2.60.0.dist-info"
    files = {"ray/__init__.py": b"", "ray/tuned.py": b"x", "ray/tune/__init__.py": b"t" * 500,
             "ray/dashboard/client/build/index.html": b"<html>" * 100, "ray/dashboard/agent.py": b"a",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n"}
    wheel = tmp_path / "ray-2.60.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", "".join(f"{n},{digest(d)},{len(d)}\n" for n, d in files.items()) +
                   f"{dist}/RECORD,,\n")
    assert wheels.strip(wheel) > 0
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {line.split(",")[0] for line in z.read(f"{dist}/RECORD").decode().splitlines()} == names
    assert names == {"ray/__init__.py", "ray/tuned.py", "ray/dashboard/agent.py", f"{dist}/WHEEL",
                     f"{dist}/METADATA", f"{dist}/RECORD"}


def test_other_wheels_are_left_as_they_are(tmp_path):
    other = tmp_path / "av-18.1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr(HIP, b"not comfy-kitchen's")
    before = other.read_bytes()
    assert wheels.strip(other) == 0 and other.read_bytes() == before


def test_a_large_wheel_is_rewritten_with_lzma_and_still_installs_and_a_small_one_is_left(tmp_path, monkeypatch):
    dist = "big-1.0.dist-info"
    # a block repeated farther apart than deflate's 32 KiB window, as in a large library: LZMA finds the repeats
    files = {"big/__init__.py": b"", "big/lib.so": b"\x7fELF " + random.Random(0).randbytes(40_000) * 4,
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: big\nVersion: 1.0\n"}
    wheel = tmp_path / "big-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", "".join(f"{n},{digest(d)},{len(d)}\n" for n, d in files.items()) +
                   f"{dist}/RECORD,,\n")
    before = wheel.read_bytes()
    monkeypatch.setattr(wheels, "SHRINK_OVER", len(before))
    assert wheels.shrink(wheel) == 0 and wheel.read_bytes() == before, "a wheel no larger than the line: left"
    monkeypatch.setattr(wheels, "SHRINK_OVER", len(before) - 1)
    assert wheels.shrink(wheel) > 0
    with zipfile.ZipFile(wheel) as z:
        assert all(i.compress_type == zipfile.ZIP_LZMA for i in z.infolist())
        assert {n: z.read(n) for n in files} == files
    after = wheel.read_bytes()
    monkeypatch.setattr(wheels, "SHRINK_OVER", 0)  # over the line still: it is seen to be LZMA already
    monkeypatch.setattr(zipfile.ZipFile, "writestr", lambda *a, **k: pytest.fail("a rerun compresses again"))
    assert wheels.shrink(wheel) == 0 and wheel.read_bytes() == after, "a rerun rewrites nothing"
    monkeypatch.undo()
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                           "--disable-pip-version-check", "--target", str(target), str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (target / "big" / "lib.so").read_bytes() == files["big/lib.so"]


def test_a_large_wheel_lzma_would_not_shrink_is_left_as_it_is(tmp_path, monkeypatch):
    wheel = tmp_path / "flat-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("flat/data.bin", random.Random(0).randbytes(100_000))  # nothing to find: LZMA's framing costs more
    before = wheel.read_bytes()
    monkeypatch.setattr(wheels, "SHRINK_OVER", 0)
    assert wheels.shrink(wheel) == 0 and wheel.read_bytes() == before
    assert list(tmp_path.iterdir()) == [wheel]


def test_the_parts_fit_the_cap_and_the_checkout_goes_in_the_last():
    sizes = {"kitchen.whl": 46, "av.whl": 34, "sqlalchemy.whl": 5, "small.whl": 1}
    parts = wheels.plan(sizes, cap=57, checkout=11)
    assert sorted(n for p in parts for n in p) == sorted(sizes)
    loads = [sum(sizes[n] for n in p) for p in parts]
    assert loads[-1] + 11 <= 57 and all(load <= 57 for load in loads)
    assert len(parts) == 2
    with pytest.raises(ValueError, match="alone is over"):
        wheels.plan({"huge.whl": 58}, cap=57, checkout=1)


def test_the_device_side_sees_which_parts_have_arrived(tmp_path):
    pool, dest = tmp_path / "pool", tmp_path / "comfy"
    pool.mkdir()
    for name, size in (("a-1-py3-none-any.whl", 600), ("b-1-py3-none-any.whl", 500), ("c-1-py3-none-any.whl", 100)):
        (pool / name).write_bytes(b"x" * size)
    parts, stamp = wheels.split(pool, dest, cap=700, checkout=50)
    assert len(parts) == 2 and (dest / "2" / "part.txt").read_text().startswith(f"2 2 {stamp}\n")
    folders, missing = wheels.parts(dest, stamp)
    assert folders == [dest / "1", dest / "2"] and missing == []
    # a part a warm machine kept from another staging is not used
    assert wheels.parts(dest, "another") == ([], ["every part of staging another"])
    # as on the device after the first call only
    for f in (dest / "2").iterdir():
        f.unlink()
    (dest / "2").rmdir()
    assert wheels.parts(dest, stamp)[1] == ["part 2 of 2"]
    (dest / "1" / parts[0][0]).unlink()
    assert f"1/{parts[0][0]}" in wheels.parts(dest)[1]
    flat = tmp_path / "flat"
    flat.mkdir()
    assert wheels.parts(flat) == ([flat], [])
