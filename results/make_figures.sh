#!/usr/bin/env bash
# Every figure and table under results/figures from the runs of results/reproduce.sh and the
# diagnostics runs (docs/results.md); each command's printout is kept beside its figure. A figure
# that needs round files (--save-rounds, not committed) is drawn only where they have been made.
# An environment is drawn once all its runs (IIF, standard, random x 3 or 5 seeds) are complete.
set -euo pipefail
cd "$(dirname "$0")/.."
F=results/figures
D=results/diagnostics
complete() {  # seeds $S (default 1 2 3) of env $1's runs under $R (default results/runs), methods
  local env=$1 rounds=$2; shift 2  # influence/none/random or $3..., hold $2 rounds
  for m in ${@:-influence none random}; do for s in ${S:-1 2 3}; do
    f=${R:-results/runs}/${env}__${m}__$s/metrics.csv
    [ -f "$f" ] && [ "$(($(wc -l < "$f") - 1))" -ge "$rounds" ] || return 1
  done; done
}
python analysis.py curves --runs results/runs --env FrozenLake-v1 --labels influence none random --out $F/curves_frozenlake.png > $F/curves_frozenlake.txt
python research/analysis_variants.py efficiency --runs results/runs --env FrozenLake-v1 --at 0.5 0.9 0.95 0.99 > $F/efficiency_frozenlake.md
python analysis.py curves --runs results/runs --env FrozenLake-v1 --labels influence none random adv-error adv-product td-weight --out $F/curves_baselines_frozenlake.png > $F/curves_baselines_frozenlake.txt
for label in random adv-error adv-product td-weight; do
  python research/analysis_variants.py efficiency --runs results/runs --env FrozenLake-v1 --label $label --at 0.5 0.9 0.99
done > $F/efficiency_baselines_frozenlake.md
if [ -d $D/FrozenLake-v1__none__3/rounds ]; then  # the round files of the --save-rounds runs (not committed)
  python analysis.py bottom-records --run $D/FrozenLake-v1__none__1 --rounds 2 5 10 --out $F/bottom_records_frozenlake.png > $F/bottom_records_frozenlake.txt
  python analysis.py advantage-diagnosis --run $D/FrozenLake-v1__none__1 --round 5 --out $F/advantage_diagnosis_frozenlake.png > $F/advantage_diagnosis_frozenlake.txt
  python analysis.py intervention --run $D/FrozenLake-v1__none__{1,2,3} --every 2 --episodes 1000 --out $F/intervention_frozenlake.png > $F/intervention_frozenlake.txt
fi
python analysis.py curves --runs results/runs --env FrozenLake-v1 --labels none p1 influence p0.25 p0.125 p0.0625 --out $F/curves_p_frozenlake.png > $F/curves_p_frozenlake.txt
for label in p1 influence p0.25 p0.125 p0.0625; do
  python research/analysis_variants.py efficiency --runs results/runs --env FrozenLake-v1 --label $label --at 0.5 0.9 0.99
done > $F/efficiency_p_frozenlake.md
if complete Acrobot-v1 50; then
  python analysis.py curves --runs results/runs --env Acrobot-v1 --labels influence none random --out $F/curves_acrobot.png > $F/curves_acrobot.txt
  python research/analysis_variants.py efficiency --runs results/runs --env Acrobot-v1 --at -400 -200 -150 -100 > $F/efficiency_acrobot.md
  if [ -d results/runs/Acrobot-v1__none__3/rounds ]; then
    python analysis.py behavior-formation --run results/runs/Acrobot-v1__none__1 --out $F/behavior_formation_acrobot.png > $F/behavior_formation_acrobot.txt
    python analysis.py intervention --run results/runs/Acrobot-v1__none__{1,2,3} --every 5 --episodes 100 --out $F/intervention_acrobot.png > $F/intervention_acrobot.txt
  fi
fi
if complete MiniGrid-Empty-8x8-v0 40; then
  python analysis.py curves --runs results/runs --env MiniGrid-Empty-8x8-v0 --labels influence none random --out $F/curves_minigrid.png > $F/curves_minigrid.txt
  python research/analysis_variants.py efficiency --runs results/runs --env MiniGrid-Empty-8x8-v0 --at 0.5 0.9 > $F/efficiency_minigrid.md
  if [ -d results/runs/MiniGrid-Empty-8x8-v0__none__1/rounds ]; then
    python analysis.py bottom-records --run results/runs/MiniGrid-Empty-8x8-v0__none__1 --rounds 2 5 --n 8 --out $F/bottom_records_minigrid.png > $F/bottom_records_minigrid.txt
  fi
  python analysis.py curves --runs results/runs --env MiniGrid-Empty-8x8-v0 --labels influence none adv-error adv-product --out $F/curves_baselines_minigrid.png > $F/curves_baselines_minigrid.txt
  for label in adv-error adv-product; do
    python research/analysis_variants.py efficiency --runs results/runs --env MiniGrid-Empty-8x8-v0 --label $label --at 0.5
  done > $F/efficiency_baselines_minigrid.md
fi
if complete highway-v0 100; then  # on envpool
  python analysis.py curves --runs results/runs --env highway-v0 --labels influence none random --out $F/curves_highway.png > $F/curves_highway.txt
  python research/analysis_variants.py efficiency --runs results/runs --env highway-v0 --at 20 25 28 > $F/efficiency_highway.md
fi
if complete highway-v0 100; then  # what testing every 2nd, 5th, 10th round would have given
  for n in 1 2 5 10; do
    echo "tested every $n round(s):"; python research/analysis_variants.py efficiency --runs results/runs --env highway-v0 --tested-every $n | sed -n '5p;/record levels,/p'
  done > $F/efficiency_highway_tested_every.md
fi
if S="1 2 3 4 5" complete LunarLander-v3 150; then  # bash results/fig6b.sh: tested every round
  python analysis.py curves --runs results/runs --env LunarLander-v3 --labels influence none random --out $F/curves_lunarlander.png > $F/curves_lunarlander.txt
  python research/analysis_variants.py efficiency --runs results/runs --env LunarLander-v3 --at 0 100 200 > $F/efficiency_lunarlander.md
  python research/analysis_variants.py efficiency --runs results/runs --env LunarLander-v3 --label random > $F/efficiency_random_lunarlander.md
  python research/analysis_variants.py efficiency --runs results/runs --env LunarLander-v3 --rounds 100 > $F/efficiency_lunarlander_100.md
  for n in 1 2 5; do
    echo "tested every $n round(s):"; python research/analysis_variants.py efficiency --runs results/runs --env LunarLander-v3 --tested-every $n | sed -n '5p;/record levels,/p'
  done > $F/efficiency_lunarlander_tested_every.md
fi
for v in preset reseed adam adam-reseed; do  # bash results/lunarlander_release.sh; finished seeds only
  if [ -f results/lunarlander-release/$v/LunarLander-v3__influence__1/metrics.csv ]; then
    echo "## $v"; python research/analysis_variants.py efficiency --runs results/lunarlander-release/$v --env LunarLander-v3 --at 0 100 200
    python analysis.py curves --runs results/lunarlander-release/$v --env LunarLander-v3 --labels influence none \
      --out $F/curves_lunarlander_release_$v.png | sed '$d'  # the final returns; drop "wrote ..."
    echo "first 100 rounds (the release's window):"
    python research/analysis_variants.py efficiency --runs results/lunarlander-release/$v --env LunarLander-v3 --rounds 100 | sed -n 5p
  fi
done > $F/efficiency_lunarlander_release.md
if [ -f results/highway-noclip/highway-v0__random__5/metrics.csv ]; then  # highway-v0 without gradient clipping
  python analysis.py curves --runs results/highway-noclip --env highway-v0 --labels influence none random --out $F/curves_highway_noclip.png > $F/curves_highway_noclip.txt
  python research/analysis_variants.py efficiency --runs results/highway-noclip --env highway-v0 --at 20 25 28 > $F/efficiency_highway_noclip.md
fi
if [ -d $D/highway-v0__none__1/rounds ]; then  # Fig. 4: "slower" (action 4), on envpool
  python analysis.py behavior-formation --run $D/highway-v0__none__1 --action 4 --phases 2.5 7.5 --out $F/behavior_formation_highway.png > $F/behavior_formation_highway.txt
fi
if R=results/coarse complete LunarLander-v3 150; then  # 3 seeds tested every 5th round, on envpool
  python analysis.py curves --runs results/coarse --env LunarLander-v3 --labels influence none random td-weight --out $F/curves_lunarlander_coarse.png > $F/curves_lunarlander_coarse.txt
  python research/analysis_variants.py efficiency --runs results/coarse --env LunarLander-v3 --at 0 100 200 > $F/efficiency_lunarlander_coarse.md
  python research/analysis_variants.py efficiency --runs results/coarse --env LunarLander-v3 --rounds 100 --at 0 100 200 > $F/efficiency_lunarlander_coarse_100.md
  if R=results/coarse complete LunarLander-v3 150 td-weight; then
    python research/analysis_variants.py efficiency --runs results/coarse --env LunarLander-v3 --label td-weight --at 0 100 200 > $F/efficiency_td_lunarlander.md
  fi
fi
if R=results/coarse complete BipedalWalker-v3 500; then  # 3 seeds tested every 10th round, on envpool
  python analysis.py curves --runs results/coarse --env BipedalWalker-v3 --labels influence none random --out $F/curves_bipedalwalker_coarse.png > $F/curves_bipedalwalker_coarse.txt
  python research/analysis_variants.py efficiency --runs results/coarse --env BipedalWalker-v3 --at 0 100 200 > $F/efficiency_bipedalwalker_coarse.md
  python research/analysis_variants.py efficiency --runs results/coarse --env BipedalWalker-v3 --label random > $F/efficiency_random_bipedalwalker_coarse.md
  R=results/coarse bash results/null_efficiency.sh BipedalWalker-v3=3 > $F/efficiency_null_bipedalwalker_coarse.md
fi
if S="1 2 3 4 5" complete BipedalWalker-v3 500 influence none; then  # bash results/fig6b.sh: tested every 2nd round
  # (random filtering: its finished seeds; analysis.py names those left out)
  python analysis.py curves --runs results/runs --env BipedalWalker-v3 --labels influence none random --out $F/curves_bipedalwalker.png > $F/curves_bipedalwalker.txt
  python research/analysis_variants.py efficiency --runs results/runs --env BipedalWalker-v3 --at -50 0 50 100 150 200 250 > $F/efficiency_bipedalwalker.md
  python research/analysis_variants.py efficiency --runs results/runs --env BipedalWalker-v3 --label random --at -50 0 50 100 150 200 250 > $F/efficiency_random_bipedalwalker.md
  python research/analysis_variants.py efficiency --runs results/runs --env BipedalWalker-v3 --rounds 250 > $F/efficiency_bipedalwalker_250.md  # the climb
  # how far a round moves the policy, IIF against standard PPO, on the Fig. 6(b) runs that log it
  python research/analysis_variants.py ablation --runs results --variants runs --env highway-v0 LunarLander-v3 BipedalWalker-v3 \
    --complete highway-v0=100 LunarLander-v3=150 BipedalWalker-v3=500 > $F/kl_fig6b.md
  for n in 2 10; do  # read every 10th round, as the results/coarse runs were tested
    echo "tested every $n round(s):"; python research/analysis_variants.py efficiency --runs results/runs --env BipedalWalker-v3 --tested-every $n | sed -n '5p;/record levels,/p'
  done > $F/efficiency_bipedalwalker_tested_every.md
fi
if S="6 7 8 9 10" R=results/bipedalwalker-climb complete BipedalWalker-v3 250 influence none; then
  # BipedalWalker's climb (results/fig6b.sh with RUNS=results/bipedalwalker-climb): seeds 6-10 beside seeds 1-5, first 250 rounds
  tmp=$(mktemp -d)
  ln -s "$PWD"/results/runs/BipedalWalker-v3__{none,influence}__[1-5] "$PWD"/results/bipedalwalker-climb/BipedalWalker-v3__* "$tmp"
  { echo "## seeds 1-10, first 250 rounds"
    python research/analysis_variants.py efficiency --runs "$tmp" --env BipedalWalker-v3 --rounds 250 --at -50 0 50 100 150 200
    echo; echo "## seeds 6-10 (results/bipedalwalker-climb)"
    python research/analysis_variants.py efficiency --runs results/bipedalwalker-climb --env BipedalWalker-v3 --at -50 0 50 100 150 200
  } > $F/efficiency_bipedalwalker_climb.md
  rm -r "$tmp"
  python analysis.py curves --runs results/bipedalwalker-climb --env BipedalWalker-v3 --labels influence none \
    --out $F/curves_bipedalwalker_climb.png > $F/curves_bipedalwalker_climb.txt
fi
envs="" null=""  # Fig. 6(b): every environment whose IIF and standard runs (env=rounds=seeds) are complete
for e in FrozenLake-v1=50=3 Acrobot-v1=50=3 MiniGrid-Empty-8x8-v0=40=3 highway-v0=100=5 LunarLander-v3=150=5 \
  BipedalWalker-v3=500=5; do
  IFS== read -r env rounds n <<< "$e"
  if S="$(seq -s ' ' "$n")" complete "$env" "$rounds" influence none; then envs="$envs $env"; null="$null $env=$n"; fi
done
python research/analysis_variants.py efficiency --runs results/runs --env $envs > $F/efficiency_all.md
python research/analysis_variants.py paper --runs results/runs --env $envs > $F/paper_fig6b.md  # t-tests, Welch against the paper, Holm
# the same at the paper's test protocol, 5 seeds: results/held_step.py's standard and IIF arms
protocol="FrozenLake-v1 Acrobot-v1 MiniGrid-Empty-8x8-v0 highway-v0"
if S="1 2 3 4 5" R=results/held-step/runs complete LunarLander-v3 150 influence standard; then
  protocol="$protocol LunarLander-v3"
fi
python research/analysis_variants.py paper --runs results/held-step/runs --baseline standard --env $protocol \
  > $F/paper_fig6b_protocol.md
{ echo "FrozenLake-v1's Fig. 6(b) row as if tested on fewer episodes than its 1000 (5 draws each; the last: as recorded)"
  for n in 200 100; do for seed in 0 1 2 3 4; do
    echo "$n episodes, draw $seed: $(python research/analysis_variants.py efficiency --runs results/runs --env FrozenLake-v1 \
      --test-episodes $n --noise-seed $seed | sed -n 5p)"
  done; done
  echo "1000 episodes, as recorded: $(python research/analysis_variants.py efficiency --runs results/runs --env FrozenLake-v1 | sed -n 5p)"
} > $F/efficiency_test_noise.md
python research/analysis_variants.py efficiency --runs results/runs --env $envs --label random > $F/efficiency_random_all.md
bash results/null_efficiency.sh $null > $F/efficiency_null.md  # the noise floor
if [ -f results/backends/highway-v0__influence-gymnasium__1/metrics.csv ]; then  # bash results/backends.sh
  python analysis.py curves --runs results/backends --env Acrobot-v1 highway-v0 --out $F/backends.png > $F/backends.txt
fi
if [ -f results/runs/rlhf-toy__influence__3/metrics.csv ]; then  # bash results/rlhf_toy.sh
  python analysis.py rlhf --runs results/runs --env rlhf-toy --out $F/rlhf_toy.png > $F/rlhf_toy.md
fi
if [ -f results/runs/grpo-filters-detox__i-ppo__5/metrics.csv ]; then  # bash results/grpo_filters.sh
  python results/grpo_filters.py > $F/grpo_filters.md
fi
if [ -f results/frontier/runs/grpo-add__random-b0.64__5/final.json ]; then  # bash results/grpo_frontier.sh
  python research/analysis_variants.py frontier --runs results/frontier/runs --env grpo-detox grpo-add \
    --out $F/grpo_frontier.png > $F/grpo_frontier.md
  python results/grpo_frontier_check.py > $F/grpo_frontier_check.md
fi
for g in grpo-toy-mu4 grpo-toy-mu4-clock; do  # ITERS=4 bash results/grpo_toy.sh, with CLOCK=1 (docs/grpo.md)
  if [ -f results/runs/${g}__influence__3/metrics.csv ]; then
    python analysis.py rlhf --runs results/runs --env $g --out $F/${g//-/_}.png > $F/${g//-/_}.md
  fi
done
# the counterfactual check (docs/counterfactual.md): needs the round files of these --save-rounds runs
if [ -d $D/FrozenLake-v1__tracin__1/rounds ]; then
  python research/analysis_variants.py counterfactual --run $D/FrozenLake-v1__tracin__1 --rounds 0 4 8 12 16 --subsets 50 --episodes 1000 --out $F/counterfactual_frozenlake.png > $F/counterfactual_frozenlake.md
fi
if [ -d results/runs/Acrobot-v1__none__1/rounds ]; then
  python research/analysis_variants.py counterfactual --run results/runs/Acrobot-v1__none__1 --rounds 0 5 10 20 40 --subsets 50 --episodes 100 --out $F/counterfactual_acrobot.png > $F/counterfactual_acrobot.md
fi
if [ -d results/runs/MiniGrid-Empty-8x8-v0__none__1/rounds ]; then
  python research/analysis_variants.py counterfactual --run results/runs/MiniGrid-Empty-8x8-v0__none__1 --rounds 0 10 20 25 35 --subsets 50 --out $F/counterfactual_minigrid.png > $F/counterfactual_minigrid.md
fi
python results/counterfactual_lds.py > $F/counterfactual_lds.md  # the three printouts above, under the one rule
# environments outside the paper (docs/results.md): the runs of results/generic.sh
GE="CartPole-v1 Pendulum-v1 MiniGrid-DoorKey-5x5-v0 LunarLanderContinuous-v3"
GC="CartPole-v1=30 Pendulum-v1=50 MiniGrid-DoorKey-5x5-v0=30 LunarLanderContinuous-v3=50"
if [ -d results/generic/base ]; then
  python research/analysis_variants.py ablation --runs results/generic --variants base guard guard0.2 adam-precond target-normalized clip target-kl p0.125 no-log-std \
    --env $GE --complete $GC > $F/generic_ablation.md
  for r in base guard; do
    python analysis.py curves --runs results/generic/$r --env $GE --labels influence none random --out $F/generic_$r.png > $F/generic_$r.txt
  done
fi
if [ -f results/generic/paper-guard/Acrobot-v1__influence__3/metrics.csv ]; then
  python research/analysis_variants.py ablation --runs results --variants runs generic/paper-guard --env Acrobot-v1 --complete Acrobot-v1=50 > $F/paper_guard.md
fi
if [ -d $D/BipedalWalker-v3__influence__1/rounds ]; then  # the log-std in and out of the score
  python research/analysis_variants.py rescore --run $D/BipedalWalker-v3__influence__1 --change no-score-log-std --every 5 > $F/rescore_bipedalwalker.md
fi
if [ -d $D/MiniGrid-DoorKey-5x5-v0__influence__1/rounds ]; then
  python research/analysis_variants.py dropped --run $D/MiniGrid-DoorKey-5x5-v0__influence__1 > $F/dropped_doorkey.md
fi
# how far an IIF round moves the records it trains on and those it drops; the runs:
#   python iif.py --env-id ENV --save-rounds --total-timesteps 40960 --runs-dir results/diagnostics --run-name ENV__influence__1
for env in FrozenLake-v1 Acrobot-v1; do
  if [ -d $D/${env}__influence__1/rounds ]; then
    python research/analysis_variants.py dropped --run $D/${env}__influence__1 > $F/dropped_$(echo ${env%%-*} | tr A-Z a-z).md
  fi
done
V="first-release released-code no-clip keep-ties raw-target minibatch-norm policy-loss"  # bash results/ablation.sh
python research/analysis_variants.py ablation --runs results/ablation --variants $V --env FrozenLake-v1 Acrobot-v1 MiniGrid-Empty-8x8-v0 \
  --complete FrozenLake-v1=50 Acrobot-v1=50 MiniGrid-Empty-8x8-v0=40 > $F/ablation.md
# FrozenLake's recipes on the seeds 1-3 that every recipe has (first-release and released-code also have 4-6)
python research/analysis_variants.py ablation --runs results/ablation --variants $V --env FrozenLake-v1 --seeds 1 2 3 \
  --complete FrozenLake-v1=50 > $F/ablation_frozenlake_seeds123.md
# the two controls: standard PPO at IIF's step size (python results/step_control.py kl|pilot|control)
# and the authors' released code (results/release/run_release.sh, then convert.py)
python results/step_control.py table > results/step-control/table.md
bash results/release/report.sh > $F/release.md
