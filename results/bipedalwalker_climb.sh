#!/usr/bin/env bash
# BipedalWalker's climb on 5 more seeds (docs/results.md, "BipedalWalker: IIF against standard PPO"):
# standard PPO and IIF, the preset unchanged, tested as results/fig6b.sh tests (100 episodes every
# 2nd round), but only the first 250 rounds (512,000 steps), where standard PPO climbs from -110 to
# about 200. Seeds 6-10, so they add to results/runs' seeds 1-5. Runs go to
# results/bipedalwalker-climb/<env>__<method>__<seed>/, resumable (see reproduce.sh).
#   [SEEDS="6 7 8 9 10"] [JOBS=2] bash results/bipedalwalker_climb.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results/bipedalwalker-climb
run() {  # method seed
  RUNS=results/bipedalwalker-climb bash results/reproduce.sh BipedalWalker-v3 "$1" "$2" \
    --eval-every 2 --eval-episodes 100 --total-timesteps 512000 \
    > "results/bipedalwalker-climb/$1.$2.log" 2>&1 && rm "results/bipedalwalker-climb/$1.$2.log"
}
export -f run
for s in ${SEEDS:-6 7 8 9 10}; do for m in none influence; do echo "$m $s"; done; done |
  xargs -P "${JOBS:-2}" -L 1 bash -c 'run "$@"' _
