#!/usr/bin/env bash
# GRPO + IIF against the cheap filters GRPO users apply, on two offline toy tasks, one run at a time:
#   detox: the toy task of results/grpo_toy.sh (benchmarks/rlhf_toy_task.py; a classifier's continuous reward),
#          60 generation batches of 64 completions (8 prompts x 8), test toxicity every 5 batches and after the
#          last, into results/runs/grpo-filters-detox__<label>__<seed>/;
#   add:   2-digit addition (benchmarks/addition_toy_task.py; reward 1 or 0 by an exact checker), 100 generation
#          batches of 64, test accuracy on 400 held-out problems every 10 batches and after the last, into
#          results/runs/grpo-filters-add__<label>__<seed>/.
# Labels: none (plain GRPO), influence (IIF), random (as many completions as IIF drops, at random),
# zero-variance (DAPO's dynamic sampling, no regeneration), max-variance (PODS), abs-advantage (CPPO),
# validation-target (IIF with f_seq on fresh completions of 8 held-out prompts, every completion with influence
# <= 0 dropped), and on addition i-ppo (I-PPO's rules: scored against the log-likelihood of the reference answers
# to 128 held-out problems, <= 0 dropped, the kept ones' losses weighted by score / mean kept score).
# Matched kept fractions: max-variance and abs-advantage keep round(F x 8) completions of each group, where F is
# IIF's mean kept fraction on that task (over its runs of the given seeds), so every seed's influence run comes
# first, then those two (KEEP=F sets F by hand). random drops as many as IIF would in each generation batch;
# zero-variance has no fraction to set.
# Resumable: a finished run is skipped, an unfinished one is redone. Summarise with
#   python results/grpo_filters.py
# Usage: bash results/grpo_filters.sh ["1 2 3 4 5"] ["add detox"]
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3 4 5"}; tasks=${2:-"add detox"}
common=(--num-generations 8 --batch-size 64 --mini-batch-size 16 --validation-size 8 --use-cpu --threads 1
        --logging-steps 1000 --runs-dir results/runs)

run() {  # run <prefix> <batches> <label> <seed> <grpo_variants.py flags...>
  local prefix=$1 batches=$2 label=$3 seed=$4; shift 4
  local name=${prefix}__${label}__${seed} dir=results/runs/${prefix}__${label}__${seed}
  if [ -f $dir/metrics.csv ] && [ $(($(wc -l < $dir/metrics.csv) - 1)) -ge $batches ]; then return; fi
  rm -rf $dir
  echo "$(date +%T) $name"
  case $label in validation-target) method=(--filter-method influence --target-data validation) ;;
                 i-ppo) method=(--filter-method i-ppo --validation-size 128) ;;
                 *) method=(--filter-method $label) ;; esac
  python research/grpo_variants.py "${common[@]}" "$@" "${method[@]}" --seed $seed --run-name $name \
    > results/runs/$name.log 2>&1 || { echo "$name failed: see results/runs/$name.log"; exit 1; }
}

keep_fraction() {  # IIF's mean kept fraction over the influence runs of the given seeds
  python - "$1" $seeds <<'EOF'
import csv, sys
prefix, seeds = sys.argv[1], sys.argv[2:]
rows = [r for s in seeds for r in csv.DictReader(open(f"results/runs/{prefix}__influence__{s}/metrics.csv"))]
print(f"{sum(int(r['n_kept']) for r in rows) / sum(int(r['completions']) for r in rows):.4f}")
EOF
}

for task in $tasks; do
  case $task in
    detox) t=results/rlhf_toy_task; prefix=grpo-filters-detox; batches=60; labels="none influence random zero-variance validation-target"
           [ -f $t/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $t
           flags=(--model-name $t/policy --reward-model $t/reward --dataset $t/prompts.jsonl
                  --eval-dataset $t/wiki_toxic.jsonl --eval-reward-model $t/eval_reward --eval-samples 200
                  --eval-every 5 --learning-rate 3e-4 --beta 0.2 --max-steps 240) ;;
    add)   t=results/addition_toy_task; prefix=grpo-filters-add; batches=100; labels="none influence random zero-variance validation-target i-ppo"
           [ -f $t/policy/config.json ] || python benchmarks/addition_toy_task.py --out $t
           flags=(--reward-fn exact-answer --model-name $t/policy --dataset $t/train.jsonl
                  --eval-dataset $t/test.jsonl --eval-samples 400 --eval-every 10 --gen-tokens 4
                  --learning-rate 1e-3 --beta 0.04 --max-steps 400) ;;
    *) echo "unknown task $task (add, detox)"; exit 1 ;;
  esac
  for seed in $seeds; do for label in $labels; do
    run $prefix $batches $label $seed "${flags[@]}"
  done; done
  keep=${KEEP:-$(keep_fraction $prefix)}
  echo "$task: --keep-fraction $keep (IIF's mean kept fraction)"
  for seed in $seeds; do for label in max-variance abs-advantage; do
    run $prefix $batches $label $seed "${flags[@]}" --keep-fraction $keep
  done; done
done
echo "$(date +%T) done"
