#!/usr/bin/env bash
# The GRPO demonstration: builds the toy task of the RLHF demonstration (benchmarks/rlhf_toy_task.py, 98 s on a
# 2-core CPU; shared with results/rlhf_toy.sh), then runs grpo_variants.py (grpo_iif.py with the test
# toxicity), 60 generation batches of 64 completions (8 prompts x 8) per seed, with the test toxicity after each,
# into results/runs/grpo-toy__<label>__<seed>/.
# Labels: none (plain GRPO), influence (GRPO + IIF, f_seq on the generation batch), random (as many
# completions dropped at random), validation (IIF with f_seq on held-out prompts' completions, as I-PPO).
# ITERS=4 makes 4 passes over each generation batch (TRL's num_iterations, GRPO's mu; 16 optimizer steps a
# generation batch) into results/runs/grpo-toy-mu4__<label>__<seed>/.
# CLOCK=1 repeats the runs without test evaluation, the labels of one seed side by side (one process each,
# so that they share the machine's load), into results/runs/grpo-toy[-mu4]-clock__<label>__<seed>/: their
# generation batches are those of the runs with evaluation (it leaves training untouched), and their clocks
# are comparable on a shared machine.
# Draw them with
#   python analysis.py rlhf --runs results/runs --env grpo-toy --out grpo_toy.png
# Resumable: a finished run is skipped, an unfinished one is redone. STEPS overrides the optimizer steps
# (4 x ITERS per generation batch), TASK the toy task's folder.
#   bash results/grpo_toy.sh "1 2 3" "none influence random"
#   ITERS=4 bash results/grpo_toy.sh "1 2 3" "none influence"
#   CLOCK=1 bash results/grpo_toy.sh "1 2 3" "none influence"
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3"}; labels=${2:-"none influence random"}
iters=${ITERS:-1}; prefix=grpo-toy; [ "$iters" = 1 ] || prefix=grpo-toy-mu$iters
clock=${CLOCK:-0}; every=1; [ "$clock" = 0 ] || { prefix=$prefix-clock; every=0; }
task=${TASK:-results/rlhf_toy_task}; steps=${STEPS:-$((240 * iters))}; batches=$((steps / (4 * iters)))
[ -f $task/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $task
flags=(--model-name $task/policy --reward-model $task/reward --dataset $task/prompts.jsonl
       --eval-dataset $task/wiki_toxic.jsonl --eval-reward-model $task/eval_reward --eval-samples 200
       --eval-every $every
       --num-generations 8 --batch-size 64 --mini-batch-size 16 --learning-rate 3e-4 --beta 0.2
       --num-iterations $iters --max-steps $steps --use-cpu --threads 1
       --logging-steps 100)
for seed in $seeds; do for label in $labels; do
  case $label in validation) method=(--filter-method influence --target-data validation --validation-size 8) ;;
                 *) method=(--filter-method $label) ;; esac
  name=${prefix}__${label}__${seed}; dir=results/runs/$name
  if [ -f $dir/metrics.csv ] && [ $(($(wc -l < $dir/metrics.csv) - 1)) -ge $batches ]; then
    echo "skipped $name: finished in $dir (remove it to run it again)"; continue
  fi
  rm -rf $dir
  python research/grpo_variants.py "${flags[@]}" "${method[@]}" --seed $seed --runs-dir results/runs --run-name $name &
  [ "$clock" = 1 ] || wait $!
done; wait; done
