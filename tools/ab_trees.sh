#!/usr/bin/env bash
# Trees of the pack taken in turns on one machine, in one call: each commit's morph/, bench/ and postprocess/ run
# from a folder of its own, because `python -m` puts the working folder ahead of PYTHONPATH (a tree put on
# PYTHONPATH from the project's root ran the working tree: bench/results/h200-2026-11-26f/NOTES.md).
#
#   bash tools/ab_trees.sh prepare REV...                      # here: .whl/ab/REV/ (git archive of REV)
#   bash tools/ab_trees.sh run OUTDIR ROUNDS TREE... -- CMD... # on the GPU machine (carry .whl/ab and .whl/gpu)
#
# run: ROUNDS rounds; in each, every TREE in the order given (a prepared REV, or `work`: the working tree) runs CMD
# from its folder, with PROJECT_COMMIT naming it and `{json}` in CMD replaced by OUTDIR/TREE-ROUND.json (its stderr
# in OUTDIR/TREE-ROUND.log). PYTHONPATH is passed on as set (the device's wheels): never the project's root.
#   bash tools/ab_trees.sh run out 2 work 8e252e0 -- python3 -m bench.batch --model /tmp/model-0.6b --device cuda \
#     --dtype bf16 --lines 256 --lengths script --batch-sizes 64 --batching continuous --first --json {json}
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
case ${1:-} in
  prepare)
    shift
    for rev in "$@"; do
      dir=.whl/ab/$rev
      rm -rf "$dir" && mkdir -p "$dir" || exit 1
      git archive "$rev" morph bench postprocess | tar -x -C "$dir" --exclude=bench/results || exit 1
      echo "$(git rev-parse "$rev")" > "$dir/COMMIT"
      echo "$dir: $(cat "$dir/COMMIT")"
    done ;;
  run)
    out=$(realpath -m "${2:?usage: bash tools/ab_trees.sh run OUTDIR ROUNDS TREE... -- CMD...}")
    rounds=${3:?ROUNDS}
    shift 3
    trees=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do trees+=("$1"); shift; done
    [ "${1:-}" = -- ] && [ $# -gt 1 ] || { echo "ab_trees: no command after --" >&2; exit 2; }
    shift
    mkdir -p "$out"
    status=0
    for round in $(seq 1 "$rounds"); do
      for tree in "${trees[@]}"; do
        if [ "$tree" = work ]; then
          dir=$root commit=$(cat .whl/gpu/COMMIT 2>/dev/null || echo "the working tree")
        else
          dir=$root/.whl/ab/$tree
          [ -d "$dir" ] || { echo "ab_trees: $tree is not prepared: bash tools/ab_trees.sh prepare $tree" >&2; exit 2; }
          commit="$(cat "$dir/COMMIT"): its morph/, bench/ and postprocess/ run from a folder of their own"
        fi
        name=$tree-$round
        cmd=("${@//\{json\}/$out/$name.json}")
        began=$(date +%s)
        (cd "$dir" && PROJECT_COMMIT="$commit" "${cmd[@]}" > /dev/null 2> "$out/$name.log")
        code=$?
        [ $code -eq 0 ] || status=1
        echo "$name: exit $code after $(( $(date +%s) - began )) s"
      done
    done
    exit $status ;;
  *)
    echo "usage: bash tools/ab_trees.sh prepare REV... | run OUTDIR ROUNDS TREE... -- CMD..." >&2
    exit 2 ;;
esac
