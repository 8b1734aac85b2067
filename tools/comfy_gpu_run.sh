#!/usr/bin/env bash
# A real ComfyUI on the GPU device machine, offline, with ComfyUI's own defaults (no --cpu, no
# --disable-cuda-malloc: its CUDA allocator choice stands). Prepare here first, right before the call:
#   COMFYUI_PATH=/path/to/ComfyUI bash tools/comfy_gpu_run_stage.sh
# then on the device (carry .comfyui and .whl/comfy):
#   bash tools/comfy_gpu_run.sh "$OUT/comfy"
# It writes report.json and server.log into that folder; extra arguments go to tools/comfy_gpu_run.py.
set -o pipefail
out=${1:?usage: bash tools/comfy_gpu_run.sh OUTDIR [comfy_gpu_run.py args]}
shift
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# The device's Python is the one a user's ComfyUI would run on; the wheels install into it.
exec "${COMFY_PYTHON:-python3}" tools/comfy_gpu_run.py --comfyui "${COMFYUI_PATH:-.comfyui}" --out "$out" "$@"
