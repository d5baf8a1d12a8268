#!/usr/bin/env bash
# The RLHF demonstration: builds the toy task (benchmarks/rlhf_toy_task.py, 98 s on a 2-core CPU), then runs
# rlhf_iif.py, 30 rounds per seed, into results/runs/rlhf-toy__<label>__<seed>/. Labels: none (standard
# PPO), influence (IIF with f_seq), random, f_return (IIF with the token-level target, App. C.8).
# Resumable: a finished run is skipped (a line says so), an unfinished one is redone. RUNS: the runs' folder
# (default results/runs, which holds the committed runs; RUNS=runs for a fresh one).
#   bash results/rlhf_toy.sh "1 2 3" "none influence"
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3"}; labels=${2:-"none influence"}
task=results/rlhf_toy_task
[ -f $task/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $task
flags=(--model-name $task/policy --reward-model $task/reward --dataset $task/prompts.jsonl
       --eval-dataset $task/wiki_toxic.jsonl --eval-reward-model $task/eval_reward --eval-samples 200
       --batch-size 64 --learning-rate 3e-4 --init-kl-coef 0.2 --rounds 30 --threads 1)
for seed in $seeds; do for label in $labels; do
  case $label in f_return) method=(--filter-method influence --target f_return) ;; *) method=(--filter-method $label) ;; esac
  name=rlhf-toy__${label}__${seed}; dir=${RUNS:-results/runs}/$name
  if [ -f $dir/metrics.csv ] && [ $(($(wc -l < $dir/metrics.csv) - 1)) -ge 30 ]; then
    echo "skipped $name: finished in $dir (remove it, or set RUNS, to run it again)"; continue
  fi
  rm -rf $dir
  python rlhf_iif.py "${flags[@]}" "${method[@]}" --seed $seed --runs-dir ${RUNS:-results/runs} --run-name $name
done; done
