#!/usr/bin/env bash
# Prepare what tools/comfy_gpu_run.sh needs on the device machine, which has no network: a lean
# copy of an existing ComfyUI checkout in .comfyui/ and the wheels in .whl/comfy/, both ignored by
# git and carried by the device call (a call carries 64 MiB in all, the repository included).
#   COMFYUI_PATH=/path/to/ComfyUI bash tools/comfy_gpu_run_stage.sh
# It copies what the server runs (Python files and small data), not tests, CI files, models,
# outputs or the tokenizer files of image/video text encoders, which load only with those models.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${COMFYUI_PATH:?set COMFYUI_PATH to a ComfyUI checkout}
dest=.comfyui
grep -qx '/.comfyui/' .git/info/exclude 2>/dev/null || { [ -d .git ] && echo '/.comfyui/' >> .git/info/exclude; }
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
dirty=$(git status --porcelain --untracked-files=no | wc -l)
[ "$dirty" -eq 0 ] || echo "note: $dirty tracked files differ from HEAD; the run uses the working tree"
bash tools/fetch_device_wheels.sh
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
total=$(( tracked + ${untracked:-0} + $(du -sb "$dest" | cut -f1) + $(du -sb .whl/comfy | cut -f1) ))
echo "travels: $(( total / 1048576 )) MiB of 64 (repository, untracked files, $dest, .whl/comfy)"
[ "$total" -lt $(( 64 * 1048576 )) ] || { echo "over the 64 MiB a device call carries" >&2; exit 1; }
