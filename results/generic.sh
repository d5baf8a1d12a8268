#!/usr/bin/env bash
# The generic-defaults ablation (docs/results.md, "Environments outside the paper"): standard PPO,
# IIF and random filtering with the generic defaults (no preset: Adam 3e-4) on four environments
# outside the paper's six, under each recipe. Runs go to
# results/generic/<recipe>/<env>__<method>__<seed>/; where a recipe changes only what is dropped,
# its "none" runs are links to the base recipe's. Resumable (see reproduce.sh); JOBS runs in
# parallel (default 2).
#   [SEEDS="1 2 3 4 5"] [ENVS="..."] [RANDOM_RUNS=0] bash results/generic.sh [recipe ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export G=results/generic
flags() {  # recipe -> iif_variants.py flags, every one set explicitly (the runs do not follow later defaults)
  local base="--optimizer adam --learning-rate 3e-4 --max-grad-norm 0 --adv-norm minibatch --target-adv raw
    --influence-loss policy --filter-ties keep --influence-precond none --target-kl 0 --filter-p 0.5 --score-log-std"
  case $1 in
    base) echo "$base --min-agreement -1" ;;  # every round filtered, as Alg. 1 (iif.py's --filter-method influence)
    guard0.2) echo "$base --min-agreement 0.2" ;;  # a looser guard
    guard) echo "$base --min-agreement 0.5" ;;  # the agreement guard
    adam-precond) echo "$base --min-agreement -1 --influence-precond adam" ;;
    target-normalized) echo "$base --min-agreement -1 --target-adv normalized" ;;
    p0.125) echo "$base --min-agreement -1 --filter-p 0.125" ;;
    no-log-std) echo "$base --min-agreement -1 --no-score-log-std" ;;  # continuous actions only
    clip) echo "$base --min-agreement -1 --max-grad-norm 0.5" ;;
    target-kl) echo "$base --min-agreement -1 --target-kl 0.02" ;;
  esac
}
budget() {  # env -> its training steps and test episodes
  case $1 in
    CartPole-v1) echo "--total-timesteps 61440 --eval-episodes 50" ;;
    MiniGrid-DoorKey-5x5-v0) echo "--total-timesteps 61440 --eval-episodes 50" ;;
    LunarLanderContinuous-v3) echo "--total-timesteps 102400 --eval-episodes 50 --eval-every 2" ;;  # long test episodes
    *) echo "--total-timesteps 102400 --eval-episodes 50" ;;
  esac
}
run() {  # recipe env method seed
  mkdir -p "$G/$1"
  RUNS=$G/$1 bash results/reproduce.sh "$2" "$3" "$4" $(budget "$2") $(flags "$1") --env-backend gymnasium \
    > "$G/$1.$2.$3.$4.log" 2>&1 && rm "$G/$1.$2.$3.$4.log"
}
export -f flags budget run
ENVS=${ENVS:-"CartPole-v1 Pendulum-v1 MiniGrid-DoorKey-5x5-v0 LunarLanderContinuous-v3"}
SEEDS=${SEEDS:-"1 2 3 4 5"}
recipes=${*:-base guard}
jobs=()
later=()  # random filtering after every standard and IIF run
for s in $SEEDS; do for recipe in $recipes; do for env in $ENVS; do  # seed by seed
  case $recipe in
    base|clip|target-kl) jobs+=("$recipe $env none $s" "$recipe $env influence $s"); later+=("$recipe $env random $s") ;;
    guard*|p0.125) jobs+=("$recipe $env influence $s"); later+=("$recipe $env random $s") ;;  # random drops as many
    *) jobs+=("$recipe $env influence $s") ;;
  esac
  case $recipe in  # standard PPO of a recipe that changes only what is dropped: the base recipe's
    base|clip|target-kl) ;;
    *) mkdir -p $G/$recipe; ln -sfn ../base/${env}__none__$s $G/$recipe/${env}__none__$s ;;
  esac
done; done; done
[ "${RANDOM_RUNS:-1}" = 1 ] || later=()  # RANDOM_RUNS=0: no random filtering runs
printf '%s\n' "${jobs[@]}" "${later[@]}" | xargs -P "${JOBS:-2}" -L 1 bash -c 'run "$@"' _
