#!/usr/bin/env bash
# Fill a folder (ignored by git) with exactly the wheels tools/device_wheels/ names for one ComfyUI version,
# for the GPU device machine's Python 3.12 on manylinux x86-64, so that tools/comfy_gpu_run.sh installs
# offline there. Versions are pinned, so a rerun gives the same files; wheels of other versions
# are removed, since two versions of one package stop the whole offline install.
#   [COMFYUI_VERSION=0.33.0 | COMFYUI_PATH=/path/to/ComfyUI] bash tools/fetch_device_wheels.sh [DEST [SECTION...]]
# The version: $COMFYUI_VERSION, else the one $COMFYUI_PATH's comfyui_version.py names, else 0.8.0, the
# oldest supported (the sections pack and tools are the same for every version). Only the named
# sections; by default all but the optional [ray], [peers] and [serve], each fetched into a folder of its own
# (qwen-tts-hf installs the import name qwen_tts, as qwen-tts does). comfy-kitchen's wheel is rewritten without its ROCm
# library (tools/comfy_gpu/wheels.py strip), which a CUDA device never loads, and a wheel over 8 MiB with its members
# LZMA-compressed (wheels.py shrink), which pip installs as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl/comfy}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$dest"
python=${PYTHON:-python3}
platforms=()
# pip matches manylinux_2_N tags exactly: list the ones these wheels are published under.
for tag in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
           manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
comfy_version=${COMFYUI_VERSION:-$( [ -n "${COMFYUI_PATH:-}" ] && "$python" tools/comfy_gpu/wheels.py version "$COMFYUI_PATH" || echo 0.8.0)}
specs=$("$python" tools/comfy_gpu/wheels.py specs "$comfy_version" "$@")
[ -n "$specs" ] || { echo "no wheels in ComfyUI $comfy_version's manifest sections: $*" >&2; exit 1; }
keep=()
for spec in $specs; do
  name=${spec%%==*}; version=${spec#*==}
  wheel_name=$(echo "$name" | tr 'A-Z-' 'a-z_')
  found=$(ls "$dest" | tr 'A-Z' 'a-z' | grep -E "^${wheel_name}-${version}-" || true)
  if [ -z "$found" ]; then
    if ! "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
         --python-version 3.12 --implementation cp "${platforms[@]}" -d "$dest" "$spec" 2>/dev/null; then
      # Published as a source archive only (sox): build its wheel here; it is pure Python.
      "$python" -m pip wheel -q --disable-pip-version-check --no-deps --no-binary=:all: -w "$dest" "$spec"
    fi
  fi
  keep+=("${wheel_name}-${version}-")
done
for f in "$dest"/*.whl; do
  base=$(basename "$f" | tr 'A-Z' 'a-z')
  ok=0
  for k in "${keep[@]}"; do case "$base" in "$k"*) ok=1 ;; esac; done
  [ "$ok" = 1 ] || { echo "removing $f (not in the manifest)"; rm -f "$f"; }
done
"$python" tools/comfy_gpu/wheels.py strip "$dest"/*.whl
"$python" tools/comfy_gpu/wheels.py shrink "$dest"/*.whl
count=$(ls "$dest"/*.whl | wc -l)
[ "$count" -eq "${#keep[@]}" ] || { echo "expected ${#keep[@]} wheels in $dest, found $count" >&2; exit 1; }
echo "$count wheels for ComfyUI $comfy_version in $dest, $(du -sh "$dest" | cut -f1)"
