#!/usr/bin/env bash
# The runs behind docs/backends.md, into results/backends/ (resumable):
# - standard PPO on Acrobot on envpool, 3 seeds, beside the gymnasium runs of results/runs;
# - standard PPO and IIF on highway-env's own highway-v0 for 30 rounds (2-4 h each at ~25 steps/s),
#   beside the first 30 rounds of the envpool runs of results/highway-noclip.
#   bash results/backends.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/backends
run() { name=$1; shift; python research/iif_variants.py --runs-dir $out --run-name "$name" --resume "$@"; }
for s in 1 2 3; do
  run Acrobot-v1__none-envpool__$s --env-id Acrobot-v1 --filter-method none --seed $s --eval-episodes 100 \
    --env-backend envpool
  ln -sfn ../runs/Acrobot-v1__none__$s $out/Acrobot-v1__none-gymnasium__$s
done
for m in none influence; do  # without gradient clipping, as the highway-v0 preset was then
  run highway-v0__$m-gymnasium__1 --env-id highway-v0 --filter-method $m --seed 1 --env-backend gymnasium \
    --total-timesteps 61440 --eval-every 5 --max-grad-norm 0
  ln -sfn ../highway-noclip/highway-v0__${m}__1 $out/highway-v0__$m-envpool__1
done
