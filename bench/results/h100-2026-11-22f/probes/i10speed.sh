#!/usr/bin/env bash
# bench/speed.py graphs and compile at k=15 and 5, native then cudaMallocAsync (one machine). arg: OUTDIR
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/comfy/*.whl
CAP=285 bash .probe/speed_alloc.sh $1 native
CAP=285 bash .probe/speed_alloc.sh $1 cudaMallocAsync
