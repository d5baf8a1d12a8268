#!/usr/bin/env bash
# I-PPO's claims on two toy tasks (docs/ippo.md): rlhf_variants.py, 30 rounds of 64 episodes per seed, into
# results/runs/ippo-<task>__<label>__<seed>/. Tasks: detox (benchmarks/rlhf_toy_task.py, 98 s to build) and cot
# (benchmarks/cot_addition_task.py, about a minute). Labels:
#   sft (the policy itself, never updated), none (standard PPO), influence (IIF, f_seq, drop <= 0),
#   i-ppo (its rules, 128 reference answers), i-ppo-noreweight (the same, loss weights 1), i-ppo-v16 (16 answers).
# Resumable: a finished run (its final.json written) is skipped, an unfinished one continues from its checkpoint.pt
# (deleted once the run is finished); a run made before rlhf_variants.py wrote final.json is run again. BETA sets --init-kl-coef (default 0.2; results/frontier.sh sweeps it), VF_COEF --vf-coef (default
# 0.1, TRL's), KL_HORIZON --kl-horizon (default 10,000), RUNS the runs' folder (default results/runs) and TAG a
# suffix of the label in the run's name.
#   bash results/ippo.sh "1 2 3 4 5" "sft none influence i-ppo i-ppo-noreweight i-ppo-v16" "detox cot"
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3 4 5"}; labels=${2:-"sft none influence i-ppo i-ppo-noreweight i-ppo-v16"}; tasks=${3:-"detox cot"}
detox=results/rlhf_toy_task; cot=results/cot_addition_task
runs=${RUNS:-results/runs}
common=(--batch-size 64 --learning-rate 3e-4 --init-kl-coef "${BETA:-0.2}" --vf-coef "${VF_COEF:-0.1}"
        --kl-horizon "${KL_HORIZON:-10000}" --rounds 30
        --threads 1 --eval-samples 200)
for task in $tasks; do
  case $task in
    detox) [ -f $detox/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out $detox
           flags=(--model-name $detox/policy --reward-model $detox/reward --dataset $detox/prompts.jsonl
                  --eval-dataset $detox/wiki_toxic.jsonl --eval-reward-model $detox/eval_reward) ;;
    cot) [ -f $cot/policy/config.json ] || python benchmarks/cot_addition_task.py --out $cot
         flags=(--task cot-addition --model-name $cot/policy --dataset $cot/train.jsonl --eval-dataset $cot/test.jsonl
                --reference-dataset $cot/validation.jsonl --gen-tokens 20) ;;
  esac
  for seed in $seeds; do for label in $labels; do
    case $label in
      sft) method=(--no-train --filter-method none) ;;
      i-ppo) method=(--filter-method i-ppo --validation-size 128) ;;
      i-ppo-noreweight) method=(--filter-method i-ppo --validation-size 128 --no-reweight) ;;
      i-ppo-v16) method=(--filter-method i-ppo --validation-size 16) ;;
      *) method=(--filter-method $label) ;;
    esac
    name=ippo-${task}__${label}${TAG:-}__${seed}; dir=$runs/$name
    if [ -f $dir/final.json ] && [ ! -f $dir/checkpoint.pt ] && [ $(($(wc -l < $dir/metrics.csv) - 1)) -ge 30 ]; then
      echo "skipped $name: finished in $dir (remove it, or set RUNS, to run it again)"; continue
    fi
    resume=()
    if [ -f $dir/checkpoint.pt ]; then resume=(--resume); else rm -rf $dir; fi
    python research/rlhf_variants.py "${common[@]}" "${flags[@]}" "${method[@]}" --seed $seed --runs-dir $runs \
      --run-name $name "${resume[@]}"
    rm -f $dir/checkpoint.pt
  done; done
done
