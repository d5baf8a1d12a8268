#!/usr/bin/env bash
# GRPO and GRPO + IIF at equal KL to the reference (docs/grpo.md, "At equal KL"): the two toy tasks of
# results/grpo_filters.sh, everything as there, at a sweep of GRPO's KL coefficient beta (--beta), into
# results/frontier/runs/grpo-<task>__<label>-b<beta>__<seed>/. Each run tests only its final policy, on the test
# prompts (final.json: its KL to the reference, training reward and test metric), where
#   python research/analysis_variants.py frontier --runs results/frontier/runs --env grpo-detox grpo-add
# reads each method against plain GRPO's frontier. Labels: none (plain GRPO), influence (IIF), random (as many
# completions dropped at random: the control). Seed by seed, JOBS (default 2) runs side by side; resumable: a run
# with its final.json is skipped, any other is redone. The task builds' summaries go to
# results/frontier/grpo-builds.txt.
#   bash results/grpo_frontier.sh ["1 2 3 4 5"] ["none influence random"] ["detox add"]
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3 4 5"}; labels=${2:-"none influence random"}; tasks=${3:-"detox add"}
export BETAS_detox=${BETAS_detox:-"0.05 0.2 0.8 3.2"} BETAS_add=${BETAS_add:-"0.01 0.04 0.16 0.64"}
detox=results/rlhf_toy_task; add=results/addition_toy_task; runs=results/frontier/runs
mkdir -p $runs
[ -f $detox/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $detox
[ -f $add/policy/config.json ] || python benchmarks/addition_toy_task.py --out $add
{ sha256sum $detox/*/model.safetensors $add/policy/model.safetensors; cat $add/build.json; echo; } \
  > results/frontier/grpo-builds.txt

run() {  # run <task> <label> <beta> <seed>
  local task=$1 label=$2 beta=$3 seed=$4 flags
  local name=grpo-${task}__${label}-b${beta}__${seed}
  [ -f $runs/$name/final.json ] && return
  rm -rf $runs/$name
  case $task in  # results/grpo_filters.sh's flags, the test after the last generation batch only
    detox) flags=(--model-name $detox/policy --reward-model $detox/reward --dataset $detox/prompts.jsonl
                  --eval-dataset $detox/wiki_toxic.jsonl --eval-reward-model $detox/eval_reward --eval-samples 200
                  --eval-every 60 --learning-rate 3e-4 --max-steps 240) ;;
    add)   flags=(--reward-fn exact-answer --model-name $add/policy --dataset $add/train.jsonl
                  --eval-dataset $add/test.jsonl --eval-samples 400 --eval-every 100 --gen-tokens 4
                  --learning-rate 1e-3 --max-steps 400) ;;
  esac
  python research/grpo_variants.py --num-generations 8 --batch-size 64 --mini-batch-size 16 --use-cpu --threads 1 \
    --logging-steps 1000 --runs-dir $runs "${flags[@]}" --beta $beta --filter-method $label --seed $seed \
    --run-name $name > $runs/$name.log 2>&1 && rm $runs/$name.log || echo "$name failed: see $runs/$name.log"
}
export -f run
export detox add runs
for seed in $seeds; do
  for task in $tasks; do betas=BETAS_$task; for beta in ${!betas}; do for label in $labels; do
    echo "$task $label $beta $seed"
  done; done; done | xargs -P "${JOBS:-2}" -L 1 bash -c 'run "$@"' _
done
