#!/usr/bin/env bash
# PPO's early drift on detox (docs/ippo.md, "At equal KL"): in the KL-penalty sweep, PPO's per-round KL in its first
# rounds reaches 10 or more at every beta. Is it the update's size rather than beta? PPO's first 6 rounds, 3 seeds,
# results/ippo.sh's flags but for: beta 0.05 and 3.2 as the sweep runs them (lr 3e-4, 4 epochs of 64 steps of one
# episode), and at beta 3.2 a third of the learning rate (1e-4) or one epoch. No test (--eval-every 0): the rounds'
# kl column is the measure. Runs: results/frontier/drift/ippo-detox__<setting>__<seed>/; the table:
#   bash results/frontier_drift.sh && python results/frontier_drift.py > results/frontier/drift.md
set -euo pipefail
cd "$(dirname "$0")/.."
detox=results/rlhf_toy_task
[ -f $detox/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $detox
for seed in 1 2 3; do
  for setting in "b0.05 --init-kl-coef 0.05" "b3.2 --init-kl-coef 3.2" "b3.2-lr1e-4 --init-kl-coef 3.2 --learning-rate 1e-4" \
                 "b3.2-epochs1 --init-kl-coef 3.2 --ppo-epochs 1"; do
    set -- $setting
    name=ippo-detox__$1__$seed; shift
    [ -f results/frontier/drift/$name/metrics.csv ] && [ $(($(wc -l < results/frontier/drift/$name/metrics.csv) - 1)) -ge 6 ] && continue
    rm -rf results/frontier/drift/$name
    python research/rlhf_variants.py --batch-size 64 --learning-rate 3e-4 --vf-coef 0.1 --rounds 6 --threads 1 --eval-every 0 \
      --model-name $detox/policy --reward-model $detox/reward --dataset $detox/prompts.jsonl \
      --eval-dataset $detox/wiki_toxic.jsonl --eval-reward-model $detox/eval_reward --filter-method none \
      --seed $seed --runs-dir results/frontier/drift --run-name $name "$@"
    rm -f results/frontier/drift/$name/checkpoint.pt  # finished
  done
done
