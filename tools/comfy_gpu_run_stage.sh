#!/usr/bin/env bash
# Prepare what tools/comfy_gpu_run.sh needs on the device machine, which has no network: a lean
# copy of an existing ComfyUI checkout in .comfyui/ and the wheels its version needs
# (tools/device_wheels/comfyui-VERSION.txt and common.txt) in .whl/comfy/1, .whl/comfy/2, ..., parts
# that each fit one device call beside the repository (a call carries 64 MiB in all). All ignored by git.
#   COMFYUI_PATH=/path/to/ComfyUI [COMFYUI_VERSION=0.33.0] bash tools/comfy_gpu_run_stage.sh
# The version is the checkout's (comfyui_version.py) unless COMFYUI_VERSION names another manifest.
# It copies what the server runs (Python files and small data), not tests, CI files, models,
# outputs or the tokenizer files of image/video text encoders, which load only with those models.
# It ends by printing the device calls to make, in order, with what each carries.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${COMFYUI_PATH:?set COMFYUI_PATH to a ComfyUI checkout}
dest=.comfyui
grep -qx '/.comfyui/' .git/info/exclude 2>/dev/null || { [ -d .git ] && mkdir -p .git/info && echo '/.comfyui/' >> .git/info/exclude; }
rm -rf "$dest"
python3 - "$src" "$dest" <<'PY'
import os, shutil, sys
src, dest = sys.argv[1:]
skip_top = {".git", ".github", ".ci", "tests", "tests-unit", "script_examples", "input", "output", "user", "temp",
            "custom_nodes", "models"}
for root, dirs, files in os.walk(src):
    rel = os.path.relpath(root, src)
    if rel == ".":
        dirs[:] = [d for d in dirs if d not in skip_top]
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for f in files:
        path = os.path.join(root, f)
        if not f.endswith(".py") and os.path.getsize(path) > 64 * 1024:
            continue
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
        shutil.copy2(path, os.path.join(dest, rel, f))
for d in ("custom_nodes", "models", "input", "output"):
    os.makedirs(os.path.join(dest, d), exist_ok=True)
PY
# The device copy has no .git: record the commit the run is made from, and whether the tree differs.
{ git rev-parse HEAD; } > "$dest/project_commit.txt"
git ls-files -s -- morph nodes postprocess workflows '*.py' requirements.txt pyproject.toml > "$dest/project_files.txt"
dirty=$(git status --porcelain --untracked-files=no | wc -l)
[ "$dirty" -eq 0 ] || echo "note: $dirty tracked files differ from HEAD; the run uses the working tree"
version=${COMFYUI_VERSION:-$(python3 tools/comfy_gpu/wheels.py version "$src")}
# The downloads are kept per version, so that switching versions and back downloads nothing again.
COMFYUI_VERSION=$version bash tools/fetch_device_wheels.sh ".whl/pool-$version"
# What a call carries of the repository: the working tree's files that git tracks or does not ignore. A tracked
# file moved out of the tree for the calls (docs/development.md: bench/results) is not carried and not counted.
repo=$(git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys
print(sum(os.path.getsize(p) for p in sys.stdin.buffer.read().decode().split("\0") if p and os.path.isfile(p)))')
checkout=$(du -sb "$dest" | cut -f1)
# What each call may add to the repository: 64 MiB less 1 MiB for what du does not count (file metadata).
cap=$(( 63 * 1048576 - repo ))
# The checkout names the staging its parts come from: parts a warm machine kept from another are not used.
python3 tools/comfy_gpu/wheels.py split ".whl/pool-$version" .whl/comfy "$cap" "$checkout" "$dest/wheel_parts.txt"
parts=$(ls .whl/comfy | sort -n | tail -1)
echo "ComfyUI $version: repository $(( repo / 1048576 )) MiB, $dest $(( checkout / 1048576 )) MiB; device calls, back to back:"
for i in $(seq 1 "$parts"); do
  if [ "$i" -lt "$parts" ]; then
    echo "  $i. carry [\".whl/comfy/$i\"]  command: python3 tools/comfy_gpu/wheels.py parts .whl/comfy"
  else
    echo "  $i. carry [\"$dest\", \".whl/comfy/$i\"]  command: bash tools/comfy_gpu_run.sh \"\$OUT/comfy\""
  fi
done
