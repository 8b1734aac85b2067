#!/usr/bin/env bash
# tests/gpu in parts side by side on one GPU machine, so that they fit device calls (600 s at most) in two: each
# part under each allocator is a run of tools/gpu_check.sh of its own (BACKENDS, TESTS) into
# OUTDIR/tests-COMMIT/PART-ALLOCATOR, stopped after LIMIT seconds (default 540). The folder is then packed into
# OUTDIR/tests-COMMIT.tgz, because a device call brings back at most 8 files. Unpack it under
# bench/results/<device>-<date>/ and commit it with a NOTES.md; tools/gpu_check_age.py reads the parts together.
#
#   bash tools/gpu_check.sh                               # here, with network: fill .whl/gpu
#   bash tools/gpu_check_parts.sh OUTDIR [PART ...]       # on the GPU machine, .whl/gpu carried
#   (on one H200, `A B` took 335 s and `M5 M60` 384 s: bench/results/h200-2026-11-29b/NOTES.md)
#
# PART is one of the names below (default: all of them). test_memory.py's two size lists are parts of their own:
# the whole file under one allocator did not finish in 545 s (bench/results/h200-2026-11-29/NOTES.md). C, the card
# table's ten renders a row, runs its rows three at a time (tests/gpu/test_cards.py): 350 s under cudaMallocAsync on
# an H200 of its own, 416 s under native beside parts A and B; both allocators' C on one H200 did not end in 545 s, so
# give each its own GPU (bench/results/h200x2-2026-11-29g/NOTES.md). If a part
# hits LIMIT, its folder holds only its log's header: run fewer parts a call.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash tools/gpu_check_parts.sh OUTDIR [PART ...]}
shift
declare -A PARTS=(
  [A]="tests/gpu/test_continuous.py tests/gpu/test_streaming.py tests/gpu/test_codec.py tests/gpu/test_prefill.py
       tests/gpu/test_kth.py tests/gpu/test_sampling_kernel.py tests/gpu/test_snake.py tests/gpu/test_ready.py"
  [B]="tests/gpu/test_paged_batch.py tests/gpu/test_live_churn.py tests/gpu/test_failures.py
       tests/gpu/test_graph_memory.py tests/gpu/test_unload.py tests/gpu/test_allocators.py"
  [C]="tests/gpu/test_cards.py"
  [M5]="tests/gpu/test_memory.py -k 5s"
  [M60]="tests/gpu/test_memory.py -k 60s"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(A B C M5 M60)
for name in "${names[@]}"; do
  [ -n "${PARTS[$name]:-}" ] || { echo "unknown part $name; choose from: ${!PARTS[*]}" >&2; exit 2; }
done
commit=$(cut -c1-7 .whl/gpu/COMMIT 2>/dev/null || echo unknown)
dir="$out/tests-$commit"
mkdir -p "$dir"
# once, before the parts: tools/gpu_check.sh installs the wheels only where no part has yet
[ -d /tmp/gpu-site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target \
  /tmp/gpu-site .whl/gpu/*.whl || exit 1
for name in "${names[@]}"; do
  for backend in cudaMallocAsync native; do
    # the allocator test starts a process per allocator itself (tools/gpu_check.sh runs it under one)
    BACKENDS=$backend TESTS="$(echo ${PARTS[$name]})" timeout "${LIMIT:-540}" bash tools/gpu_check.sh \
      "$dir/$name-$backend" > "$dir/$name-$backend.log" 2>&1 &
  done
done
wait
status=0
for name in "${names[@]}"; do
  for backend in cudaMallocAsync native; do
    report="$dir/$name-$backend/gpu_check.json"
    if [ -f "$report" ]; then
      python3 - "$report" "$name" <<'EOF' || status=1
import json, sys
backends = json.load(open(sys.argv[1]))["backends"]
for backend, got in backends.items():
    print(f"{sys.argv[2]:4} {backend:15} {got['passed']} passed, {len(got['failed'])} failed, {got['seconds']} s",
          *got["failed"])
sys.exit(any(got["failed"] for got in backends.values()))
EOF
    else
      echo "$name $backend: no result (stopped at ${LIMIT:-540} s, or it could not start: $dir/$name-$backend.log)"
      status=1
    fi
  done
done
tar -czf "$out/tests-$commit.tgz" -C "$out" "tests-$commit" && rm -rf "$dir"
exit $status
