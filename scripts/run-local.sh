#!/usr/bin/env bash
# The tutorial's experiment on this machine, each job a whole process, tracked offline.
#   scripts/run-local.sh main          profile and bench, workers 0 and 4 (make run)
#   scripts/run-local.sh alternating   bench jobs in alternating order, REPEATS (6) x WORKERS (make bench-alternating)
# GPU when present; on a CPU-only machine, fewer steps (announced). CIFAR-10 when it is on
# disk under ./data, else the synthetic set (announced). Override with DATA=cifar10|synthetic.
# A failing job does not stop the others (Ctrl-C or SIGTERM in a job stops them all); the script ends with steplens report over the runs
# it made (bench rates, trace evidence, the traces to open), then (main) the tutorial's decision on workers 0 -> 4
# from the local runs of the latest runs' settings, and exits 1 if any job failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
what=${1:-main}
export POLYAXON_OFFLINE_ROOT=${POLYAXON_OFFLINE_ROOT:-$PWD/.polyaxon-offline}
export POLYAXON_TRACKING_FLUSH_DELAY=0

bad() { echo "run-local.sh: error: $*" >&2; exit 2; }
case "${DATA:-}" in ""|cifar10|synthetic) ;; *) bad "DATA must be cifar10 or synthetic, got '$DATA'" ;; esac
# 6 repeats by default: 6 pairs are the fewest an exact sign test can call a difference with (steplens compare).
REPEATS=${REPEATS:-6}
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || bad "REPEATS must be a whole number of 1 or more, got '${REPEATS}'"
for w in ${WORKERS:-0 4}; do [[ $w =~ ^[0-9]+$ ]] || bad "WORKERS must be whole numbers, got '$w'"; done
for v in WARMUP_STEPS BENCH_STEPS; do
  [ -z "${!v:-}" ] || [[ ${!v} =~ ^[1-9][0-9]*$ ]] || bad "$v must be a whole number of 1 or more, got '${!v}'"
done
if [ -z "${DATA:-}" ]; then
  if [ -d data/cifar-10-batches-py ]; then DATA=cifar10
  else
    DATA=synthetic
    echo "*** CIFAR-10 is not in ./data: using SYNTHETIC CIFAR-shaped data (same transforms)."
    echo "*** For the real set: make run DATA=cifar10 (downloads into ./data)."
  fi
fi
args=(--data "$DATA")
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "*** CUDA found: the tutorial's step counts."
else
  args+=(--warmup-steps "${WARMUP_STEPS:-2}" --bench-steps "${BENCH_STEPS:-5}" --unprofiled-steps 4)
  echo "*** NO CUDA: running on the CPU with --warmup-steps ${WARMUP_STEPS:-2} --bench-steps ${BENCH_STEPS:-5} --unprofiled-steps 4"
  echo "*** (the profile schedule keeps its 10 steps); these are CPU numbers, not GPU numbers."
fi

list_runs() { ls "$POLYAXON_OFFLINE_ROOT/runs" 2>/dev/null | sort || true; }
before=$(list_runs)
failed=0
run() {  # run TRAIN.PY FLAGS...: one job; a failure is counted, not fatal; Ctrl-C or a SIGTERM stops them all
  echo "=== train.py $*"
  local rc=0
  "$PY" train.py "$@" || rc=$?
  if [ "$rc" = 130 ] || [ "$rc" = 143 ]; then
    echo "*** stopped (exit $rc) during train.py $*: the jobs after it were not started" >&2
    exit "$rc"
  fi
  [ "$rc" = 0 ] || { echo "*** FAILED (exit $rc): train.py $*" >&2; failed=$((failed + 1)); }
}

case "$what" in
  main)
    for mode in profile bench; do
      for workers in 0 4; do run --mode "$mode" --workers "$workers" "${args[@]}"; done
    done
    ;;
  alternating)
    for repeat in $(seq 1 "$REPEATS"); do
      for workers in ${WORKERS:-0 4}; do run --mode bench --workers "$workers" --repeat "$repeat" "${args[@]}"; done
    done
    ;;
  *) echo "run-local.sh: error: unknown target '$what' (main or alternating)" >&2; exit 2 ;;
esac

new=$(comm -13 <(echo "$before") <(list_runs))
echo
echo "=== the runs of this call (all local runs: COLUMNS=220 $PY -m polyaxon ops ls --offline --path $POLYAXON_OFFLINE_ROOT)"
if [ -n "$new" ]; then
  # shellcheck disable=SC2086  # one uuid per word
  "$PY" -m steplens report "$POLYAXON_OFFLINE_ROOT" $new
  if [ "$what" = main ]; then  # the tutorial's decision on workers 0 -> 4, from the local runs of these settings
    echo
    echo "=== the decision on --workers 0 -> 4 (scripts/decide_pairs.py; written to $POLYAXON_OFFLINE_ROOT/decisions.md)"
    "$PY" scripts/decide_pairs.py "$POLYAXON_OFFLINE_ROOT" 0 4 ||
      echo "*** no decision could be made from these runs (above: why)" >&2
  fi
else
  echo "no runs were recorded"
fi
[ "$failed" = 0 ] || { echo "*** $failed job(s) failed" >&2; exit 1; }
