#!/usr/bin/env bash
# A real ComfyUI on the GPU device machine, offline, with ComfyUI's own defaults (no --cpu, no
# --disable-cuda-malloc: its CUDA allocator choice stands). Prepare here first, right before the calls:
#   COMFYUI_PATH=/path/to/ComfyUI bash tools/comfy_gpu_run_stage.sh
# It copies the checkout to .comfyui, fetches the wheels of its version (tools/device_wheels/) and splits
# them into .whl/comfy/1, .whl/comfy/2, ..., each fitting one call beside the repository (64 MiB a call),
# and prints the calls. Make them back to back on one warm machine (a part already there stays there;
# a fresh machine has none): every call but the last carries one part and only lists what has arrived,
# the last carries .comfyui and its part and runs. ComfyUI 0.8.0 takes one call (about 59 MiB):
#   run(carry=[".comfyui", ".whl/comfy/1"], command='bash tools/comfy_gpu_run.sh "$OUT/comfy"')
# ComfyUI 0.33.0 takes two (comfy-kitchen, even without its ROCm library, is 46 MiB; part 1 about 62 MiB
# with the repository, part 2 with .comfyui about 55 MiB):
#   run(carry=[".whl/comfy/1"], command="python3 tools/comfy_gpu/wheels.py parts .whl/comfy")
#   run(carry=[".comfyui", ".whl/comfy/2"], command='bash tools/comfy_gpu_run.sh "$OUT/comfy"')
# The run refuses to start, naming them, if parts are missing. It writes report.json and server.log into
# that folder; extra arguments go to tools/comfy_gpu_run.py.
set -o pipefail
out=${1:?usage: bash tools/comfy_gpu_run.sh OUTDIR [comfy_gpu_run.py args]}
shift
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# The device's Python is the one a user's ComfyUI would run on; the wheels install into it.
exec "${COMFY_PYTHON:-python3}" tools/comfy_gpu_run.py --comfyui "${COMFYUI_PATH:-.comfyui}" --out "$out" "$@"
