# One train.py job of a study, sourced by scripts/study.sh and scripts/distortion_study.sh.
#
#   job MODE REPEAT|- CONFIG [train.py flags...]
#
# Runs train.py --mode MODE --device cuda CONFIG [flags...] FLAGS... as one process, pinned by PIN,
# with PY, its output in ROOT/logs/NNN-MODE.log; REPEAT (not -) adds --repeat REPEAT. The caller sets
# root (the offline root), flags (an array: train.py flags for every job, last, so they override),
# PIN and PY, and n=0 failed=0 (counted here). A failing job prints the end of its log; the caller goes on.
job() {
  local mode=$1 repeat=$2 config cmd log rc=0 t0=$SECONDS
  read -r -a config <<< "$3"
  shift 3
  cmd=(train.py --mode "$mode" --device cuda "${config[@]}" "$@")
  [ "$repeat" = - ] || cmd+=(--repeat "$repeat")
  cmd+=("${flags[@]}")
  n=$((n + 1)); log=$(printf '%s/logs/%03d-%s.log' "$root" "$n" "$mode")
  echo "=== ${cmd[*]}"
  # shellcheck disable=SC2086  # PIN is a command line, split on purpose
  $PIN "$PY" "${cmd[@]}" > "$log" 2>&1 || rc=$?
  echo "--- $((SECONDS - t0)) s"
  if [ "$rc" = 0 ]; then
    grep -E '^(bench|profile):' "$log" || true
  else
    failed=$((failed + 1))
    echo "*** FAILED (exit $rc), the end of $log:"; tail -n 15 "$log" | sed 's/^/    /'
  fi
}
