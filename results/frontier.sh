#!/usr/bin/env bash
# RLHF methods at equal KL to the reference (docs/ippo.md, "At equal KL"): results/ippo.sh's runs (30 rounds of
# 64 episodes, everything else as there) at a sweep of the KL penalty beta (--init-kl-coef), into
# results/frontier/runs/ippo-<task>__<label>-b<beta>__<seed>/. The adaptive controller stays as ippo.sh has it:
# its horizon of 10,000 episodes moves beta by at most 4 % over a run's 1,920 episodes, so each run's beta stays
# within 4 % of the one it starts at. Every point runs on the builds of the two toy tasks made where it runs (a build on
# another machine differs; ippo.sh's committed runs were made on another), whose summaries go to
# results/frontier/builds.txt. Resumable, as ippo.sh. Seed by seed: every point's seed 2 runs before any seed 3, so
# a sweep cut short has whole seeds. JOBS runs in parallel (default 2), a (task, beta) each. VF_COEF sets the value
# loss's coefficient (default 0.1, TRL's; its runs are named <label>-vf<VF_COEF>-b<beta> when set):
#   VF_COEF=0.01 bash results/frontier.sh "1 2 3 4 5" "none influence i-ppo i-ppo-noreweight" detox   # docs/ippo.md
#   [BETAS_detox="..."] [BETAS_cot="..."] [VF_COEF=...] bash results/frontier.sh "1 2 3 4 5" "none influence i-ppo i-ppo-noreweight" "detox cot"
# KL_HORIZON sets the adaptive controller's horizon (default 10,000 episodes, TRL's; its runs are named
# <label>-h<KL_HORIZON>-b<beta> when set). The paper's 10,000 over its 109 rounds of 256 episodes, scaled to a toy
# run's 30 of 64, is 688: there the controller acts on beta as it would over the paper's run:
#   KL_HORIZON=688 BETAS_detox=0.2 bash results/frontier.sh "1 2 3 4 5" "none influence" detox
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-"1 2 3 4 5"}; labels=${2:-"none influence i-ppo i-ppo-noreweight"}; tasks=${3:-"detox cot"}
export BETAS_detox=${BETAS_detox:-"0.05 0.2 0.8 1.6 3.2"} BETAS_cot=${BETAS_cot:-"0.05 0.2 0.8 1.6"}
mkdir -p results/frontier/runs
jobs=()
for task in $tasks; do
  betas=BETAS_$task
  for beta in ${!betas}; do jobs+=("$task $beta"); done
done
run() {  # task beta: every seed and label, seed by seed
  local tag=${VF_COEF:+-vf$VF_COEF}${KL_HORIZON:+-h$KL_HORIZON}-b$2
  local log=results/frontier/$1$tag.$$.log
  BETA=$2 RUNS=results/frontier/runs TAG=$tag bash results/ippo.sh "$SEEDS" "$LABELS" "$1" > $log 2>&1 && rm $log
}
export -f run
export LABELS="$labels"
# the tasks, built here unless they are (as ippo.sh builds them), and a record of what was built
[ -f results/rlhf_toy_task/eval_reward/config.json ] || python benchmarks/rlhf_toy_task.py --out results/rlhf_toy_task
[ -f results/cot_addition_task/policy/config.json ] || python benchmarks/cot_addition_task.py --out results/cot_addition_task
{ sha256sum results/rlhf_toy_task/*/model.safetensors results/cot_addition_task/policy/model.safetensors
  cat results/cot_addition_task/build.json; echo; } > results/frontier/builds.txt
for seed in $seeds; do
  printf '%s\n' "${jobs[@]}" | SEEDS=$seed xargs -P "${JOBS:-2}" -L 1 bash -c 'run "$@"' _
done
