"""The device's wheels: the manifest for a ComfyUI version (tools/device_wheels/), the comfy-kitchen wheel
rewritten without its ROCm library, and the wheels split into parts that each fit one device call.

Standard library only, so that the staging scripts run it with any python3:
    python3 tools/comfy_gpu/wheels.py version CHECKOUT          # the checkout's ComfyUI version
    python3 tools/comfy_gpu/wheels.py specs VERSION [SECTION...] # name==version lines (default: all but the optional)
    python3 tools/comfy_gpu/wheels.py strip WHEEL...            # drop the files a CUDA device never loads
    python3 tools/comfy_gpu/wheels.py shrink WHEEL...           # a large wheel's members LZMA-compressed
    python3 tools/comfy_gpu/wheels.py split POOL DEST CAP_BYTES CHECKOUT_BYTES STAMP_FILE
    python3 tools/comfy_gpu/wheels.py parts DEST                # which parts have arrived (on the device)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

MANIFESTS = Path(__file__).resolve().parents[1] / "device_wheels"
# Members a CUDA device never loads, by wheel (a name ending in "/" is a folder): comfy-kitchen's ROCm build
# (10.6 MB of its 58 MB); Ray's Java jars, dashboard web client and libraries the pack's plain actors never import
# (the 79 MB wheel would not fit one device call).
NOT_LOADED = {"comfy_kitchen": ("comfy_kitchen/backends/hip/_C.abi3.so",),
              "ray": ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/",
                      "ray/llm/")}
# A wheel over this is rewritten with its members LZMA-compressed: pip reads such a wheel as any other, and av's 34 MiB
# become 26, so the pack's and the server's wheels fit one device call beside the checkout.
SHRINK_OVER = 8 * 2**20
PART_FILE = "part.txt"
OPTIONAL = ("peers", "ray", "serve")  # manifest sections fetched only when named


def comfyui_version(checkout: Path) -> str:
    """__version__ from the checkout's comfyui_version.py (ComfyUI writes it at each release)."""
    text = (Path(checkout) / "comfyui_version.py").read_text()
    found = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", text)
    if not found:
        raise ValueError(f"no __version__ in {checkout}/comfyui_version.py")
    return found.group(1)


def read_manifest(path: Path) -> dict[str, list[str]]:
    """{section: ["name==version", ...]} from one manifest file ("[section]" lines start one)."""
    sections: dict[str, list[str]] = {}
    current = "default"
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        sections.setdefault(current, []).append(line)
    return sections


def manifest_for(version: str, folder: Path = MANIFESTS) -> dict[str, list[str]]:
    """common.txt's sections (pack, tools, and the optional ray, peers and serve) and comfyui-VERSION.txt's
    (server). A version without a file of its own is refused: its server may import packages no manifest names."""
    own = Path(folder) / f"comfyui-{version}.txt"
    if not own.is_file():
        known = sorted(p.stem.removeprefix("comfyui-") for p in Path(folder).glob("comfyui-*.txt"))
        raise FileNotFoundError(f"no wheel manifest for ComfyUI {version} (have: {', '.join(known)}); "
                                "write one, or name a close version explicitly")
    sections = read_manifest(Path(folder) / "common.txt")
    for name, specs in read_manifest(own).items():
        sections.setdefault(name, []).extend(specs)
    return sections


def strip(wheel: Path) -> int:
    """Rewrite the wheel without the members NOT_LOADED names for it, and without their RECORD lines, under
    the same name; the bytes saved (0 when there was nothing to drop: a rerun leaves it as it is)."""
    wheel = Path(wheel)
    drop = NOT_LOADED.get(wheel.name.split("-")[0].lower(), ())
    if not drop:
        return 0
    def dropped(name: str) -> bool:
        return any(name.startswith(d) if d.endswith("/") else name == d for d in drop)

    with zipfile.ZipFile(wheel) as src:
        if not any(dropped(name) for name in src.namelist()):
            return 0
        before = wheel.stat().st_size
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in src.infolist():
                if dropped(info.filename):
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    data = "".join(line for line in data.decode().splitlines(keepends=True)
                                   if not dropped(line.split(",", 1)[0])).encode()
                out.writestr(info, data, compress_type=info.compress_type)
    os.replace(tmp, wheel)
    return before - wheel.stat().st_size


def shrink(wheel: Path) -> int:
    """Rewrite a wheel over SHRINK_OVER bytes under the same name with every member LZMA-compressed (RECORD's hashes
    are of the members' contents, which stay as they were), where that makes it smaller; the bytes saved (0 for a
    smaller wheel, one rewritten already, or one LZMA does not shrink: a rerun leaves it as it is)."""
    wheel = Path(wheel)
    before = wheel.stat().st_size
    if before <= SHRINK_OVER:
        return 0
    with zipfile.ZipFile(wheel) as src:
        if all(info.compress_type == zipfile.ZIP_LZMA for info in src.infolist()):
            return 0
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as out:
            for info in src.infolist():
                out.writestr(info, src.read(info), compress_type=zipfile.ZIP_LZMA)
    if tmp.stat().st_size >= before:  # nothing gained: the wheel stays as it was
        tmp.unlink()
        return 0
    os.replace(tmp, wheel)
    return before - wheel.stat().st_size


def plan(sizes: dict[str, int], cap: int, checkout: int) -> list[list[str]]:
    """The wheels in parts of at most `cap` bytes each (first fit, largest first); the checkout (carried in
    the last call, which runs) counts in the part it shares, and that part comes last."""
    bins: list[list] = []
    items = sorted([*sizes.items(), (None, checkout)], key=lambda kv: -kv[1])
    for name, size in items:
        if size > cap:
            raise ValueError(f"{name or 'the ComfyUI checkout'} ({size} bytes) alone is over {cap} bytes")
        home = next((b for b in bins if b[0] + size <= cap), None)
        if home is None:
            home = [0, []]
            bins.append(home)
        home[0] += size
        home[1].append(name)
    bins.sort(key=lambda b: None in b[1])
    return [sorted(n for n in b[1] if n is not None) for b in bins]


def split(pool: Path, dest: Path, cap: int, checkout: int) -> tuple[list[list[str]], str]:
    """DEST/1, DEST/2, ...: the pool's wheels in parts (hard links where possible), each with a part.txt
    saying which part of how many it is, of which staging (a stamp: the hash of the plan), and what it
    holds; the parts and the stamp."""
    wheels = {p.name: p.stat().st_size for p in Path(pool).glob("*.whl")}
    parts = plan(wheels, cap, checkout)
    stamp = hashlib.sha256(repr(parts).encode()).hexdigest()[:12]
    shutil.rmtree(dest, ignore_errors=True)
    for i, names in enumerate(parts, 1):
        folder = Path(dest) / str(i)
        folder.mkdir(parents=True)
        for name in names:
            try:
                os.link(Path(pool) / name, folder / name)
            except OSError:
                shutil.copy2(Path(pool) / name, folder / name)
        (folder / PART_FILE).write_text(f"{i} {len(parts)} {stamp}\n" + "".join(n + "\n" for n in names))
    return parts, stamp


def parts(dest: Path, stamp: str | None = None) -> tuple[list[Path], list[str]]:
    """The folders pip finds the wheels in and what is missing. A folder without parts is one flat folder.
    With a stamp (the checkout carried in the last call names its staging's), parts a machine kept from
    another staging are left out."""
    files = list(Path(dest).glob(f"*/{PART_FILE}"))
    if not files:
        return [Path(dest)], []
    found = {}
    for f in files:
        index, total, its_stamp = f.read_text().split("\n", 1)[0].split()
        if stamp is None or its_stamp == stamp:
            found[int(index)] = (f.parent, int(total), f.read_text().splitlines()[1:])
    if not found:
        return [], [f"every part of staging {stamp}"]
    total = max(t for _, t, _ in found.values())
    missing = [f"part {i} of {total}" for i in range(1, total + 1) if i not in found]
    missing += [f"{folder.name}/{w}" for folder, _, names in found.values() for w in names
                if not (folder / w).is_file()]
    return [found[i][0] for i in sorted(found)], missing


def main(argv: list[str]) -> int:
    cmd, rest = argv[0], argv[1:]
    if cmd == "version":
        print(comfyui_version(Path(rest[0])))
    elif cmd == "specs":
        try:
            sections = manifest_for(rest[0])
        except FileNotFoundError as e:
            print(e, file=sys.stderr)
            return 1
        wanted = rest[1:] or [s for s in sections if s not in OPTIONAL]
        print("\n".join(s for name in wanted for s in sections.get(name, [])))
    elif cmd == "strip":
        for wheel in rest:
            saved = strip(Path(wheel))
            if Path(wheel).name.split("-")[0].lower() in NOT_LOADED:
                print(f"{Path(wheel).name}: {saved / 2**20:.1f} MiB dropped, {Path(wheel).stat().st_size / 2**20:.1f} MiB")
    elif cmd == "shrink":
        for wheel in rest:
            saved = shrink(Path(wheel))
            if saved:
                size = Path(wheel).stat().st_size / 2**20
                print(f"{Path(wheel).name}: LZMA, {saved / 2**20:.1f} MiB saved, {size:.1f} MiB")
    elif cmd == "split":
        plan_, stamp = split(Path(rest[0]), Path(rest[1]), int(rest[2]), int(rest[3]))
        for i, names in enumerate(plan_, 1):
            size = sum((Path(rest[1]) / str(i) / n).stat().st_size for n in names)
            print(f"part {i}: {len(names)} wheels, {size / 2**20:.1f} MiB")
        Path(rest[4]).write_text(stamp + "\n")
    elif cmd == "parts":
        folders, missing = parts(Path(rest[0]))
        print("present: " + " ".join(str(f) for f in folders) + ("; missing: " + ", ".join(missing) if missing else ""))
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
