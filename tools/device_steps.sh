# Sourced by the benches that spend one GPU device call (tools/bench_gpu.sh, tools/evidence_gpu.sh): what they
# share on either side of the call.

# record_tree DIR (here, before the call): the device's copy of the tree has no .git, so DIR/COMMIT and DIR/CHANGES
# say what it is made from (the commit, and the tracked files that differ from it).
record_tree() {
  git rev-parse HEAD > "$1/COMMIT"
  git status --porcelain --untracked-files=no | cut -c4- > "$1/CHANGES"
  [ -s "$1/CHANGES" ] && echo "note: $(wc -l < "$1/CHANGES") tracked files differ from HEAD; the run uses the working tree"
  return 0
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
