#!/usr/bin/env bash
# The GRPO demonstration: builds the toy task of the RLHF demonstration (benchmarks/rlhf_toy_task.py, about 3
# minutes; shared with results/rlhf_toy.sh), then runs grpo_iif.py, 60 generation batches of 64 completions
# (8 prompts x 8) per seed, with the test toxicity after each, into results/runs/grpo-toy__<label>__<seed>/.
# Labels: none (plain GRPO), influence (GRPO + IIF, f_seq on the generation batch), random (as many
# completions dropped at random), validation (IIF with f_seq on held-out prompts' completions, as I-PPO).
# Draw them with
#   python analysis.py rlhf --runs results/runs --env grpo-toy --out grpo_toy.png
# Resumable: a finished run is skipped, an unfinished one is redone. STEPS overrides the optimizer steps
# (4 per generation batch), TASK the toy task's folder.
#   bash results/grpo_toy.sh "1 2 3" "none influence random"
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3"}; labels=${2:-"none influence random"}
task=${TASK:-results/rlhf_toy_task}; steps=${STEPS:-240}; batches=$((steps / 4))
[ -f $task/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $task
flags=(--model-name $task/policy --reward-model $task/reward --dataset $task/prompts.jsonl
       --eval-dataset $task/wiki_toxic.jsonl --eval-reward-model $task/eval_reward --eval-samples 200
       --num-generations 8 --batch-size 64 --mini-batch-size 16 --learning-rate 3e-4 --beta 0.2
       --max-steps $steps --validation-size 8 --use-cpu --threads 1 --logging-steps 100)
for seed in $seeds; do for label in $labels; do
  case $label in validation) method=(--filter-method influence --target-data validation) ;;
                 *) method=(--filter-method $label) ;; esac
  name=grpo-toy__${label}__${seed}; dir=results/runs/$name
  if [ -f $dir/metrics.csv ] && [ $(($(wc -l < $dir/metrics.csv) - 1)) -ge $batches ]; then continue; fi
  rm -rf $dir
  python grpo_iif.py "${flags[@]}" "${method[@]}" --seed $seed --runs-dir results/runs --run-name $name
done; done
