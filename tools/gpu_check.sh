#!/usr/bin/env bash
# The GPU checks (tests/gpu) under both CUDA allocator backends, on a machine with an NVIDIA GPU.
#
#   bash tools/gpu_check.sh            # here, with network: fill .whl/gpu from tools/device_wheels/common.txt
#   bash tools/gpu_check.sh OUTDIR     # on the GPU machine (no network): install those wheels, run the
#                                      # tests under cudaMallocAsync (ComfyUI's default) and the native
#                                      # allocator, and write OUTDIR/gpu_check.json with the project commit
#                                      # (BACKENDS="native" runs one of them; TESTS="tests/gpu/test_a.py ..."
#                                      # a part of the tests: all of them under cudaMallocAsync took an H100
#                                      # past a device call's 600 s, so two calls, two OUTDIRs, and
#                                      # tools/gpu_check_age.py adds the parts up)
#
# The GPU machine gets this tree with .whl/gpu carried along (its wheels are pinned in the manifest,
# so a refill gives the same files). The project commit is written next to them here, because
# the copy on the GPU machine may have no .git.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1; then
  # The tests need the pack's wheels only, not a ComfyUI server's (tools/comfy_gpu_run_stage.sh fills .whl/comfy).
  bash tools/fetch_device_wheels.sh .whl/gpu pack tools || exit 1
  git rev-parse HEAD > .whl/gpu/COMMIT
  echo "wheels ready; on the GPU machine run: bash tools/gpu_check.sh \$OUT (carry .whl/gpu)"
  exit 0
fi
out=${1:?usage: bash tools/gpu_check.sh OUTDIR}
mkdir -p "$out"
# once per machine: parts of the tests may run side by side, each its own call of this script
[ -d /tmp/gpu-site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target \
  /tmp/gpu-site .whl/gpu/*.whl || exit 1
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
status=0
for backend in ${BACKENDS:-cudaMallocAsync native}; do
  if [ "$backend" = native ]; then unset PYTORCH_CUDA_ALLOC_CONF; else export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; fi
  echo "=== tests/gpu under $backend"
  start=$(date +%s)
  # the allocator test starts a process per backend itself: once is enough
  only=(); [ "$backend" = native ] && only=(--deselect tests/gpu/test_allocators.py)
  python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/gpu} "${only[@]}" --junitxml "$out/gpu_$backend.xml" 2>&1 | tail -n 25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "$(( $(date +%s) - start ))" > "$out/gpu_$backend.seconds"
done
python3 - "$out" <<'EOF'
import json, os, pathlib, platform, sys, xml.etree.ElementTree as ET
import torch
out = pathlib.Path(sys.argv[1])
commit = pathlib.Path(".whl/gpu/COMMIT")
report = {"commit": commit.read_text().strip() if commit.exists() else None,
          "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
          "tests": os.environ.get("TESTS", "tests/gpu"), "backends": {}}
for backend in ("cudaMallocAsync", "native"):
    xml = out / f"gpu_{backend}.xml"
    if not xml.exists():
        continue
    cases = ET.parse(xml).getroot().iter("testcase")
    rows = {"passed": [], "failed": [], "skipped": []}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        kind = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        rows[kind].append(name)
    report["backends"][backend] = {"passed": len(rows["passed"]), "failed": rows["failed"],
                                   "skipped": len(rows["skipped"]),
                                   "seconds": int((out / f"gpu_{backend}.seconds").read_text())}
(out / "gpu_check.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report, indent=1))
EOF
exit $status
