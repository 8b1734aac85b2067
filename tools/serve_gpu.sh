#!/usr/bin/env bash
# The speech server under load on a GPU (bench/serve.py against `cli.py serve`), random 0.6B and 1.7B weights (Base
# and a saved clone, or CustomVoice and a built-in speaker),
# in one GPU device call (DEADLINE_S, default 540 s, keeps it inside the 600 s a call may run):
#
#   bash tools/serve_gpu.sh            # here, with network: fill .whl/gpu with the pack's wheels (sections pack,
#                                      # tools of tools/device_wheels/common.txt: what `bash tools/gpu_check.sh`
#                                      # fetches) and .whl/serve with the server's (section serve:
#                                      # `bash tools/fetch_device_wheels.sh .whl/serve serve`), record the commit
#   bash tools/serve_gpu.sh OUTDIR     # on the GPU machine (no network), carrying .whl/gpu and .whl/serve
#
# The device call (run tool): command "bash tools/serve_gpu.sh $OUT", carry [".whl/gpu", ".whl/serve"],
# timeout_s 600. It writes OUTDIR/serve-0.6b.json and OUTDIR/serve-1.7b.json (bench.serve's report: settings,
# environment, each rate's summary and every request), the servers' logs beside them (serve-SIZE.server.log) and
# OUTDIR/serve_gpu.log.
#
# On the GPU machine it installs the wheels offline (the pack's into /tmp/gpu-site, as tools/gpu_check.sh does, the
# server's into /tmp/serve-site), builds both checkpoints at once (bench.random_model, bf16; before any measuring),
# then per size starts `cli.py serve --model M --device cuda --dtype bf16 --batch-size $BATCH` with an empty voices
# folder of its own (a 0.6B voice does not fit the 1.7B) under cudaMallocAsync, and runs bench.serve against it:
# 3 warm-up requests, then each rate of $RATES for $WINDOWS windows of $DURATION s of Poisson arrivals, requests of
# 3 to 10 s of speech, each one at most $TIMEOUT s, in the voice VARIANT gives: base (the default), a clone saved
# through POST /v1/audio/voices from a synthetic clip; custom_voice, the model's built-in speaker "vivian". With
# KILL_AT=S, a last window at the last rate has its engine process killed S s in (bench.serve --kill-engine). Each
# step is bounded by what is left of DEADLINE_S (default 540 s from the start), the 0.6B run by SIZE_CAP_S (default
# 200 s) too, so that the 1.7B gets its turn; a run cut off gets SIGINT, so its server shuts down and its JSON keeps
# the rates done (bench.serve saves after each; "complete": false).
# Overrides (environment): RATES (default 1,5,20), DURATION (20), WINDOWS (1), BATCH (32), TIMEOUT (30), SIZES
# ("0.6b 1.7b"), VARIANT (base), KILL_AT (none),
# SERVE_EXTRA (more `cli.py serve` flags, e.g. "--kv-cache-gib 8" for the paged cache),
# DEADLINE_S, SIZE_CAP_S, MODELS (a folder holding model-0.6b and model-1.7b of that VARIANT built already: no
# build), e.g. RATES=1,10,20,40 DURATION=20 BATCH=64 bash tools/serve_gpu.sh $OUT (several rates
# at a longer duration fit one size a call: SIZES=1.7b).
#
# The peer, faster-qwen3-tts 0.5.4, is not run: its wheel has no HTTP server (its `faster-qwen3-tts serve` reads
# lines from stdin); the OpenAI-style one is examples/openai_server.py of its repository, outside the wheel, and it
# ignores a request's max_new_tokens and seed (on random weights, which never end a line, each request would run to
# 2,048 frames) and serves one request at a time.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/device_steps.sh
if ! command -v nvidia-smi >/dev/null 2>&1; then
  bash tools/fetch_device_wheels.sh .whl/gpu pack tools || exit 1
  bash tools/fetch_device_wheels.sh .whl/serve serve || exit 1
  git rev-parse HEAD > .whl/gpu/COMMIT  # as tools/gpu_check.sh records it
  record_tree .whl/serve
  fits_call .whl/gpu .whl/serve || exit 1
  echo "ready; on the GPU machine run: bash tools/serve_gpu.sh \$OUT (carry .whl/gpu and .whl/serve)"
  exit 0
fi

out=${1:?usage: bash tools/serve_gpu.sh OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/serve_gpu.log") 2>&1
tee_pid=$!
deadline=$(( $(date +%s) + ${DEADLINE_S:-540} ))
rates=${RATES:-1,5,20}
duration=${DURATION:-20}
windows=${WINDOWS:-1}
variant=${VARIANT:-base}
case "$variant" in
  base) voice=alice ;;
  custom_voice) voice=vivian ;;  # bench/random_model.py's speakers
  *) echo "VARIANT: $variant is neither base nor custom_voice"; exit 2 ;;
esac
kill_args=(); [ -n "${KILL_AT:-}" ] && kill_args=(--kill-engine "$KILL_AT")
batch=${BATCH:-32}
request_timeout=${TIMEOUT:-30}
read -r -a sizes <<< "${SIZES:-0.6b 1.7b}"
status=0
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
# once per machine, as tools/gpu_check.sh does: a later call on the warm machine need not carry the wheels again
[ -d /tmp/gpu-site ] || $PIP --target /tmp/gpu-site .whl/gpu/*.whl || exit 1
[ -d /tmp/serve-site ] || $PIP --target /tmp/serve-site .whl/serve/*.whl || exit 1
PROJECT_COMMIT=$(cat .whl/serve/COMMIT 2>/dev/null || cat .whl/gpu/COMMIT 2>/dev/null || true)
PROJECT_CHANGES=$(cat .whl/serve/CHANGES 2>/dev/null || true)
export PROJECT_COMMIT PROJECT_CHANGES PYTHONPATH=/tmp/serve-site:/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "rates $rates, $windows windows of $duration s each, batch $batch, request timeout $request_timeout s, sizes ${sizes[*]}, $variant, voice $voice"

# a folder of its own per call: a warm machine keeps the last call's /tmp, and the builder refuses a full folder
work=$(mktemp -d)
build_cap=$(( deadline - $(date +%s) < 240 ? deadline - $(date +%s) : 240 ))
echo "=== build ${sizes[*]} at once (at most $build_cap s)"
began=$(date +%s)
pids=()
for size in "${sizes[@]}"; do
  if [ -n "${MODELS:-}" ]; then ln -s "$MODELS/model-$size" "$work/model-$size"; true &
  else timeout "$build_cap" python3 -m bench.random_model --size "$size" --variant "$variant" --dtype bfloat16 \
    --out "$work/model-$size" > "$out/build-$size.log" 2>&1 &
  fi
  pids+=($!)
done
for i in "${!sizes[@]}"; do
  wait "${pids[$i]}"
  echo "exit $? after $(( $(date +%s) - began )) s" | tee "$out/build-${sizes[$i]}.status"
done

for i in "${!sizes[@]}"; do
  size=${sizes[$i]}
  left=$(( deadline - $(date +%s) ))
  cap=$left
  # all but the last size leave room for the next ones
  [ "$i" -lt $(( ${#sizes[@]} - 1 )) ] && [ "$cap" -gt "${SIZE_CAP_S:-200}" ] && cap=${SIZE_CAP_S:-200}
  if ! grep -q "^exit 0 " "$out/build-$size.status"; then
    echo "=== serve $size: skipped, its checkpoint was not built (see $out/build-$size.log)" | tee "$out/serve-$size.status"
    status=1
    continue
  fi
  if [ "$cap" -lt 60 ]; then
    echo "=== serve $size: skipped, $left s left" | tee "$out/serve-$size.status"
    status=1
    continue
  fi
  echo "=== serve $size (at most $cap s)"
  began=$(date +%s)
  # SIGINT: bench.serve stops its server on the way out; KILL 45 s later if either hangs
  timeout -s INT -k 45 "$cap" python3 -m bench.serve \
    --serve "--model $work/model-$size --device cuda --dtype bf16 --batch-size $batch --voices $work/voices-$size ${SERVE_EXTRA:-}" \
    --rates "$rates" --duration "$duration" --windows "$windows" --voice "$voice" "${kill_args[@]}" \
    --timeout "$request_timeout" --warmup 3 --start-timeout "$cap" \
    --json "$out/serve-$size.json"
  code=$?
  [ "$code" -eq 0 ] || status=1
  echo "exit $code after $(( $(date +%s) - began )) s" | tee "$out/serve-$size.status"
done
rm -rf "$work"

echo "=== summary"
python3 - "$out" "${sizes[@]}" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for size in sys.argv[2:]:
    path = out / f"serve-{size}.json"
    status = (out / f"serve-{size}.status").read_text().strip() if (out / f"serve-{size}.status").exists() else "?"
    if not path.exists():
        print(f"{size}: no report ({status})")
        continue
    report = json.loads(path.read_text())
    print(f"{size}: {path} ({'complete' if report.get('complete') else 'incomplete'}; {status}; "
          f"server log {report.get('server_log')})")
    for rate in report["rates"]:
        s = rate["summary"]
        print(f"  rate {s['rate']:>5}/s: {s['ok']}/{s['sent']} ok, errors {s['errors'] or '-'}, achieved "
              f"{s['achieved_rate']}/s, TTFA p50/p95 {s['ttfa_p50_s']}/{s['ttfa_p95_s']} s, RTF p50/min "
              f"{s['rtf_p50']}/{s['rtf_min']}, streams with gaps {s['streams_with_gaps']}, peak in flight "
              f"{s['peak_concurrency']}")
    for spread in report.get("spreads", []):
        print(f"  rate {spread['rate']:>5}/s over {spread['windows']} windows: TTFA p95 {spread['ttfa_p95_s']}")
    if report.get("kill"):
        print(f"  kill: {report['kill']['summary']}, restart {report['kill']['restart_s']} s, after it "
              f"{[r['ok'] for r in report['kill']['after_restart']]}")
EOF
ls -l "$out"
exec >&- 2>&-  # let tee write the log's last lines before the device collects OUTDIR
wait "$tee_pid"
exit $status
