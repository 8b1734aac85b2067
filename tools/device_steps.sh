# Sourced by the benches that spend one GPU device call (tools/bench_gpu.sh, tools/evidence_gpu.sh,
# tools/serve_gpu.sh): what they share on either side of the call.

# record_tree DIR (here, before the call): the device's copy of the tree has no .git, so DIR/COMMIT and DIR/CHANGES
# say what it is made from (the commit, and the tracked files that differ from it).
record_tree() {
  git rev-parse HEAD > "$1/COMMIT"
  git status --porcelain --untracked-files=no | cut -c4- > "$1/CHANGES"
  [ -s "$1/CHANGES" ] && echo "note: $(wc -l < "$1/CHANGES") tracked files differ from HEAD; the run uses the working tree"
  return 0
}

# fits_call DIR... (here, before the call): the repository, its untracked files and the wheel folders DIR... are what
# the call carries; say how much, and fail over the 64 MiB a call takes.
fits_call() {
  local tracked untracked wheels total
  tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
  wheels=$(du -sb "$@" | awk '{s += $1} END {print s}')
  total=$(( tracked + ${untracked:-0} + wheels ))
  echo "travels: $(( total / 1048576 )) MiB of 64 (repository, untracked files, $*)"
  [ "$total" -lt $(( 64 * 1048576 )) ] || { echo "over the 64 MiB a device call carries" >&2; return 1; }
}

# step NAME CAP_S MIN_S COMMAND... (on the device): run COMMAND for at most CAP_S or what is left before $deadline,
# if at least MIN_S are; how it ended goes to $status_dir/NAME.status, so a step that fails or runs out of time is
# recorded as such and the next still runs.
step() {
  local name=$1 cap=$2 min=$3 left began
  shift 3
  left=$(( deadline - $(date +%s) ))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt "$min" ]; then
    echo "=== $name: skipped, $left s left" | tee "$status_dir/$name.status"
    return
  fi
  echo "=== $name (at most $cap s): $*"
  began=$(date +%s)
  timeout "$cap" "$@"
  echo "exit $? after $(( $(date +%s) - began )) s" | tee "$status_dir/$name.status"
}
