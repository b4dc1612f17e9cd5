#!/usr/bin/env bash
# The next try at 25% of the bf16 dense peak at batch 128 (1.72 ms of GPU time a step), on an NVIDIA H200
# machine. The roofline of the best set (docs/RESULTS.md#the-roofline-by-kernel-class-2026-12-05) puts the
# batch-norm and elementwise kernels at 26% and 37% of the memory limit: 0.61 ms a step above their floor,
# in about 245 kernels of about 2 us. Two levers on the best set B, both torch.compile settings
# (train.py --inductor-tuning):
#   pointwise  time each pointwise and reduction kernel's block sizes while compiling
#   combo      fuse independent small kernels (the weight casts, the running statistics) into one launch
#
#   scripts/next_try_128.sh ROOT [STAGE]     STAGE: 1-6 (one alternating round), profile, or all (default)
#
# Rounds 1-3 run B and both levers; after round 3, a lever goes on to rounds 4-6 (6 pairs: a sign-test
# verdict) only if the median of its 3 paired ratios is above 1.02 (ROOT/levers-after-round-3.txt).
# profile: a lean profile of each configuration, then the comparison (rates, losses: the learning check)
# and the roofline of the profiles. A stage takes 3-4 minutes (3 jobs of about 60 s; round 1 longer while
# pointwise times its kernels), all of it about 25 minutes. PY as in scripts/study.sh.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/next_try_128.sh ROOT [1-6|profile|all]" >&2; exit 2; }
root=$1 stage=${2:-all}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
B='--workers 0 --gpu-input --cuda-graph --compile default --amp bf16 --channels-last --fused-sgd --cudnn-benchmark --batch-size 128'
F=(--data learnable --scale-lr --warmup-steps 100 --lr-warmup-steps 80 --bench-steps 300)
ALL="$B;$B --inductor-tuning pointwise;$B --inductor-tuning combo"
study() { scripts/lever_study.sh "$root" "$@" --baseline inductor_tuning=off -- "${F[@]}"; }

passed() {  # the levers whose 3 first pairs gain more than 2%, decided once, after round 3
  local file=$root/levers-after-round-3.txt
  if [ ! -f "$file" ]; then
    "$PY" - "$root/comparison/comparison.json" > "$file.partial" <<'EOF'
import json, statistics, sys
for g in json.load(open(sys.argv[1]))["tables"][0]["groups"]:
    ratios = [p["ratio"] for p in g.get("pairs") or []]
    if "inductor_tuning=" in g["group"] and len(ratios) == 3 and statistics.median(ratios) > 1.02:
        print(g["group"].split("inductor_tuning=")[1].split(",")[0])
EOF
    mv "$file.partial" "$file"
  fi
  cat "$file"
}

round() {
  local n=$1 configs=$ALL
  if [ "$n" -gt 3 ]; then
    configs=$B
    for l in $(passed); do configs="$configs;$B --inductor-tuning $l"; done
    [ "$configs" != "$B" ] || { echo "round $n: no lever gained more than 2% in rounds 1-3"; return 0; }
  fi
  CONFIGS=$configs FIRST_ROUND=$n PROFILE=0 study 1 0
}

profile() {
  CONFIGS=$ALL study 0 0
  find "$root/runs" -path '*outputs/traces/trace-cycle1-steps2-4.pt.trace.json*' -print0 |
    xargs -0 "$PY" -m steplens roofline --model train:build_model
}

case $stage in
  [1-6]) round "$stage" ;;
  profile) profile ;;
  all) for n in 1 2 3 4 5 6; do round "$n"; done; profile ;;
  *) echo "usage: scripts/next_try_128.sh ROOT [1-6|profile|all]" >&2; exit 2 ;;
esac
