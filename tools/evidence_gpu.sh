#!/usr/bin/env bash
# The bench figures whose meaning issue 34 changed, in one device call of under 9 minutes on one H100:
#
#   bash tools/evidence_gpu.sh           # here, with network: fill .whl/gpu with the pack's wheels (sections pack,
#                                        # tools), record the commit and the tracked files that differ from it
#   bash tools/evidence_gpu.sh OUTDIR    # on the GPU machine (no network), carrying .whl/gpu: writes OUTDIR/*.json,
#                                        # every part with its step's ending in OUTDIR/evidence.json, OUTDIR/evidence.log
#
# Random 0.6B bf16 weights, ComfyUI's allocator (cudaMallocAsync), mode auto = fused unless named; in this order,
# each step bounded by what is left of DEADLINE_S (default 530 s from the start):
#   batch32    bench/batch.py: 32 lines of 62 frames (about 5 s), x-vector and ICL alternating, batch 32, k=5,
#              3 repeats: decode only (BatchTTS.codes), then in turn the render (BatchTTS.render, its first run the
#              first in the process) and the script job (ScriptJob.run into a folder: smoothing, files, manifest,
#              SRT, dialogue); about 40 s. First, so that Triton's compile (about 10 s on a fresh machine) falls in
#              its untimed warm-up and every first call below finds the kernels on disk.
#   speed      bench/speed.py: one 250-frame line, x-vector voice, batch 1, upstream qwen-tts and STACKS (default
#              fused and graphs at k=15 and 5): per stack end to end and decode only in turn, 3 runs each (the first
#              end-to-end run its first call in the process), then the codec it runs, alone, 3 times; about 390 s,
#              upstream's 6 runs of about 50 s each most of it
#   script256  bench/batch.py the same on the 256-line script at batch 64 (about 60 s), if 90 s are left
# A step that fails or runs out of time is recorded as such; the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_steps.sh
if ! command -v nvidia-smi >/dev/null 2>&1; then
  bash tools/fetch_device_wheels.sh .whl/gpu pack tools || exit 1
  record_tree .whl/gpu
  echo "ready; on the GPU machine run: bash tools/evidence_gpu.sh \$OUT (carry .whl/gpu)"
  exit 0
fi

out=${1:?usage: bash tools/evidence_gpu.sh OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/evidence.log") 2>&1
tee_pid=$!
deadline=$(( $(date +%s) + ${DEADLINE_S:-530} ))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
  .whl/gpu/*.whl || exit 1
PROJECT_COMMIT=$(cat .whl/gpu/COMMIT 2>/dev/null || true)
PROJECT_CHANGES=$(cat .whl/gpu/CHANGES 2>/dev/null || true)
export PROJECT_COMMIT PROJECT_CHANGES PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-backend:cudaMallocAsync}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

status_dir=$out

# a folder of its own per call: a warm machine keeps the last call's /tmp, and the builder refuses a full folder
model=$(mktemp -d)/model-0.6b
step build 150 60 python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out "$model"
batch=(python3 -m bench.batch --model "$model" --device cuda --dtype bf16 --modes auto --seq-groups 5 --repeats 3)
step batch32 90 30 "${batch[@]}" --lines 32 --frames 62 --batch-sizes 32 --json "$out/batch32.json"
step speed 480 60 python3 -m bench.speed --model "$model" --device cuda --dtype bf16 --prompts xvector --repeats 3 \
  --stacks "${STACKS:-upstream,auto:15,auto:5,graphs:15,graphs:5}" --agreement "" --json "$out/speed.json"
step script256 120 90 "${batch[@]}" --lines 256 --lengths script --batch-sizes 64 --json "$out/script256.json"

python3 - "$out" <<'EOF'
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[1])
parts = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "evidence"}
steps = {p.stem: p.read_text().strip() for p in sorted(out.glob("*.status"))}
head = next(({k: p[k] for k in ("commit", "uncommitted_changes", "device", "torch", "transformers", "python")}
             for p in parts.values() if "commit" in p), {})
report = dict(head, gpu=(out / "gpu.txt").read_text().strip(),
              allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "native", steps=steps, parts=parts)
(out / "evidence.json").write_text(json.dumps(report, indent=1))
print(json.dumps(dict(head, steps=steps), indent=1))
EOF
exec >&- 2>&-  # let tee write the log's last lines before the device collects OUTDIR
wait "$tee_pid"
