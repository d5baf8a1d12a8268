#!/usr/bin/env bash
# The reproduction ablation (README, "What changes the numbers"): standard PPO and IIF under the
# first-release recipe, the released code's recipe, and each of the released code's choices
# switched alone. Runs go to results/ablation/<variant>/<env>__<method>__<seed>/; where a variant
# cannot change standard PPO, its "none" runs are links to those of the first-release recipe
# (gradients clipped at 0.5, buffer-normalised advantages, full PPO loss scored). Resumable (see
# reproduce.sh); JOBS runs in parallel (default 2), the most informative variants first.
#   bash results/ablation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export A=results/ablation
flags() {
  local first="--max-grad-norm 0.5 --adv-norm buffer --target-adv normalized --influence-loss full --filter-ties drop"
  case $1 in
    first-release) echo "$first" ;;
    released-code) echo "--max-grad-norm 0 --adv-norm minibatch --target-adv raw --influence-loss policy --filter-ties keep" ;;
    no-clip) echo "$first --max-grad-norm 0" ;;
    raw-target) echo "$first --target-adv raw" ;;
    minibatch-norm) echo "$first --adv-norm minibatch" ;;
    policy-loss) echo "$first --influence-loss policy" ;;
    keep-ties) echo "$first --filter-ties keep" ;;
  esac
}
run() {  # variant env method seed
  local episodes=100 save=""
  [ "$2" = FrozenLake-v1 ] && episodes=1000
  [ "$1" = released-code ] && [ "$3" = none ] && save="--save-rounds"
  RUNS=$A/$1 bash results/reproduce.sh "$2" "$3" "$4" --eval-episodes $episodes $(flags "$1") $save --env-backend gymnasium \
    > "$A/$1.$2.$3.$4.log" 2>&1 && rm "$A/$1.$2.$3.$4.log"
}
export -f flags run
jobs=()
add() {  # variant "envs" "methods" ["seeds"]
  for env in $2; do for m in $3; do for s in ${4:-1 2 3}; do jobs+=("$1 $env $m $s"); done; done; done
}
FL=FrozenLake-v1; AC=Acrobot-v1; MG=MiniGrid-Empty-8x8-v0
add first-release "$FL $AC $MG" "none influence"
add released-code "$FL $AC $MG" "none influence random"
add no-clip "$FL $AC $MG" "none influence"
add keep-ties $FL influence
add raw-target $FL influence
add minibatch-norm $FL "none influence"
add policy-loss $MG influence
add raw-target "$AC $MG" influence
add minibatch-norm "$AC $MG" "none influence"
add first-release $FL "none influence" "4 5 6"  # FrozenLake's spread hides the differences at 3 seeds
add released-code $FL "none influence" "4 5 6"
for v in raw-target policy-loss keep-ties; do  # scoring choices only: standard PPO is first-release's
  mkdir -p $A/$v
  for env in $FL $AC $MG; do for s in 1 2 3 4 5 6; do
    [ "$env" = $FL ] || [ $s -le 3 ] || continue
    [ -e $A/$v/${env}__none__$s ] || ln -s ../first-release/${env}__none__$s $A/$v/${env}__none__$s
  done; done
done
printf '%s\n' "${jobs[@]}" | xargs -P "${JOBS:-2}" -L 1 bash -c 'run "$@"' _
