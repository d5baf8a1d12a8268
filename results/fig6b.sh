#!/usr/bin/env bash
# Fig. 6(b) under the paper's test protocol (docs/results.md, "Fig. 6(b) tested every round"): each
# paper preset unchanged, 5 seeds of standard PPO, IIF and random filtering, tested every round.
# LunarLander: 200 fresh test episodes a round instead of the paper's 1000; BipedalWalker: 100
# every 2nd round. highway-v0's preset already tests 100 episodes every round.
# Runs go to $RUNS/<env>__<method>__<seed>/ (RUNS defaults to results/runs), seed by seed;
# resumable (see reproduce.sh); JOBS in parallel (default 1); FLAGS are added to every iif_variants.py call.
# The earlier 3-seed runs, tested every 5th (LunarLander) or 10th (BipedalWalker) round, are in
# results/coarse/.
#   [SEEDS="1 2 3 4 5"] [ENVS="..."] [METHODS="none influence random"] [JOBS=1] [RUNS=...] [FLAGS=...] bash results/fig6b.sh
# BipedalWalker's climb on 5 more seeds, standard PPO and IIF, first 250 rounds (docs/results.md):
#   RUNS=results/bipedalwalker-climb ENVS=BipedalWalker-v3 SEEDS="6 7 8 9 10" METHODS="none influence" \
#     FLAGS="--total-timesteps 512000" JOBS=2 bash results/fig6b.sh
set -euo pipefail
cd "$(dirname "$0")/.."
protocol() {  # env -> test flags
  case $1 in
    LunarLander-v3) echo "--eval-every 1 --eval-episodes 200 --env-backend envpool" ;;
    BipedalWalker-v3) echo "--eval-every 2 --eval-episodes 100 --env-backend envpool" ;;
  esac
}
run() {  # env method seed
  local log=${RUNS:-results/runs}/$1.$2.$3.log
  bash results/reproduce.sh "$1" "$2" "$3" $(protocol "$1") ${FLAGS:-} > "$log" 2>&1 && rm "$log"
}
export -f protocol run
ENVS=${ENVS:-"LunarLander-v3 BipedalWalker-v3"}
SEEDS=${SEEDS:-"1 2 3 4 5"}
mkdir -p "${RUNS:-results/runs}"
for env in $ENVS; do for s in $SEEDS; do for m in ${METHODS:-none influence random}; do echo "$env $m $s"; done; done; done |
  xargs -P "${JOBS:-1}" -L 1 bash -c 'run "$@"' _
