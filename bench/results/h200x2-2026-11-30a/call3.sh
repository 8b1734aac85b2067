#!/usr/bin/env bash
# Call 3 (one H200): test_memory.py's 5 s and 60 s sizes (M5, M60) under both allocators side by side.
out=${1:?OUTDIR}
LIMIT=560 bash tools/gpu_check_parts.sh "$out" M5 M60 > "$out/log.txt" 2>&1
