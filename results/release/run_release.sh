#!/usr/bin/env bash
# Runs the authors' released code (github.com/LDAORL/LDA-ORL) with its own scripts: per seed,
# standard PPO, then IIF (12.5 % of the negative records dropped), on MiniGrid-Empty-8x8 (SGD 5e-3,
# 20 IIF rounds, standard checkpoints 0-20 tested) and LunarLander (the headline Adam 1e-3
# scripts, 100 IIF rounds, checkpoints 0-100 tested). convert.py turns the logs into metrics.csv.
#
#   RELEASE=/path/to/LDA-ORL nohup nice -n 5 bash results/release/run_release.sh \
#       > /work/release-work/queue.log 2>&1 &
#
# Settings (environment): RELEASE (a copy of the release; or the first argument), RELEASE_COMMIT
# (its commit, for config.json, where RELEASE is no git work tree), VENV (/work/release-venv),
# WORK (/work/release-work), ENVS ("minigrid lunarlander"), SEEDS ("1 2 3 4 5"), TEST_EPISODES
# (100), CPUS (the taskset list their IIF scripts take; 0-1), KEEP_BULK=1 (keep the .pkl batch
# files and buffers of a finished seed), TEST_ALL=1 (test standard PPO's checkpoints past the
# scripts' window too, with their test script: MiniGrid 21-40, LunarLander 101-150). For a smoke
# test only: ROUNDS (IIF rounds and tested checkpoints) and STD_STEPS (standard training's steps).
# The venv (Python 3.11; the release's requirements.txt does not resolve):
#   pip install torch==2.13.0 "gymnasium==0.29.1" "numpy<2" "box2d==2.3.10" "minigrid==3.0.0" \
#       "pygame>=2.4" wandb tensorboard matplotlib pandas tqdm cloudpickle
# Everything the scripts write (checkpoints, batch files, tb_logs, per-round result texts) goes to
# $WORK/traditional-rl/<env>/, wall times of every Python process to $WORK/timing/. One queue per
# WORK at a time. Resumable: a finished seed and method is skipped, and IIF resumes at its first
# unfinished round; a standard run restarts its training or its tests if they were cut short.
set -euo pipefail
SRC=$(cd "${1:-${RELEASE:?give the path of a copy of the release}}" && pwd)
VENV=${VENV:-/work/release-venv}
WORK=${WORK:-/work/release-work}
TEST_EPISODES=${TEST_EPISODES:-100}
CPUS=${CPUS:-0-1}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK/bin" "$WORK/timing"
git -C "$SRC" rev-parse HEAD > "$WORK/release_commit" 2>/dev/null ||
  echo "${RELEASE_COMMIT:-unknown}" > "$WORK/release_commit"

# The release's code, fresh at every start (outputs stay), with the smallest changes that run here:
cp -r "$SRC/traditional-rl/." "$WORK/traditional-rl/"
cd "$WORK/traditional-rl"
# 1. wandb.init in every training script would ask for a login: disable wandb.
export WANDB_MODE=disabled
# 2. The patched stable-baselines3 is a bare folder, not an installed package.
export PYTHONPATH=$WORK/traditional-rl
# 3. The result folders the scripts write into are never created.
mkdir -p minigrid/results_minigrid lunarlander/results_lunarlander
# 4. Tests on TEST_EPISODES episodes instead of 1000.
sed -i "s/--num_episodes 1000/--num_episodes $TEST_EPISODES/" minigrid/*.sh lunarlander/*.sh
# 5. LunarLander saves a checkpoint after every update (~6.5 GB a seed standard, ~9 GB IIF): save
#    it every 320 updates (once a round), as the MiniGrid scripts do; only those are read.
sed -i 's/^\( *\)\(model.save(checkpoint_filename)\)$/\1if model._update_counter % 320 == 0: \2/' \
  lunarlander/train_lunarlander_with_callbacks.py lunarlander/train_lunarlander_with_given_states.py
sed -i 's/^        \(model.save(.*f"policy_grad_{t+1}.zip"))\)$/            \1/' \
  lunarlander/train_lunarlander_with_given_batches.py
# 6. Resuming: the IIF scripts run rounds $FIRST_ROUND to $LAST_ROUND (round 0 is outside their
#    loop), and MiniGrid's standard test covers checkpoints 0 to LAST_ROUND + 1; the defaults below
#    are the rounds as written (0-19 MiniGrid, 0-99 LunarLander).
sed -i -e 's/^taskset -c ${cpus} bash run_.* 0 neg-bottom /[ "$FIRST_ROUND" -gt 0 ] || &/' \
  -e 's/^for i in {1..[0-9]*}$/for i in $(seq $((FIRST_ROUND > 1 ? FIRST_ROUND : 1)) $LAST_ROUND)/' \
  minigrid/run_iif_minigrid.sh lunarlander/run_iif_lunarlander_adam.sh
sed -i 's/ 0 20 / 0 $((LAST_ROUND + 1)) /' minigrid/run_eval_baseline.sh
# Smoke tests only: a shorter standard run.
if [ -n "${STD_STEPS:-}" ]; then
  sed -i "s/--total_timesteps [0-9]*/--total_timesteps $STD_STEPS/" \
    minigrid/run_train_minigrid_sgd.sh lunarlander/run_lunarlander_adam_training.sh
fi
# Not a change to the scripts: every `python` they start runs through timed.py (wall times).
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$VENV/bin/python" "$here/timed.py" > "$WORK/bin/python"
chmod +x "$WORK/bin/python"
export PATH=$WORK/bin:$PATH OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

tested() {  # file: how many tests it holds
  cat "$1" 2>/dev/null | grep -c '^Average return' || true
}
iif_first_unfinished() {  # results folder, seed: the first IIF round whose test has not finished
  local r=0
  while [ "$r" -le "$LAST_ROUND" ] && [ "$(tested "$(echo \
    "$1"/result_*_rol-0-$r-$((r + 1))_neg-bottom-12.5_*_seed-$2.txt)")" -gt 0 ]; do
    r=$((r + 1))
  done
  echo $r
}
log() { echo "$(date '+%F %T') $*"; }

for env in ${ENVS:-minigrid lunarlander}; do
  cd "$WORK/traditional-rl/$env"
  if [ $env = minigrid ]; then rounds=${ROUNDS:-20}; else rounds=${ROUNDS:-100}; fi
  export LAST_ROUND=$((rounds - 1))
  for s in ${SEEDS:-1 2 3 4 5}; do
    if [ $env = minigrid ]; then
      std=minigrid_88_sgd_lr-5e-3_feat-64_step-80k_seed-$s
      # the release's README names run_train_minigrid_adam.sh, which it does not hold: its SGD script
      train="bash run_train_minigrid_sgd.sh $s"
      test="bash run_eval_baseline.sh $s $CPUS"
      iif=run_iif_minigrid.sh
    else
      std=lunarlander_adam_lr-1e-3_step-310k_seed-$s
      train="bash run_lunarlander_adam_training.sh $s"
      test="bash run_lunarlander_adam_test.sh $s 0 $rounds"
      iif=run_iif_lunarlander_adam.sh
    fi
    export RELEASE_TIMING=$WORK/timing/${env}__none__$s.jsonl
    if [ "$(tested results_$env/result_$std.txt)" -lt $((rounds + 1)) ]; then
      if [ ! -f models_$env/$std/final_policy.zip ]; then
        log "$env seed $s: standard training"
        $train
      fi
      log "$env seed $s: standard tests"
      $test
    fi
    if [ -n "${TEST_ALL:-}" ]; then  # standard PPO's later checkpoints too (convert.py: none-all)
      if [ $env = minigrid ]; then last=40 script=run_test_minigrid_policy_act7.sh
      else last=150 script=run_test_lunarlander_policy.sh; fi
      more=results_$env/result_${std}_rounds-$((rounds + 1))-$last.txt
      if [ "$(tested $more)" -lt $((last - rounds)) ]; then
        log "$env seed $s: standard tests $((rounds + 1))-$last"
        RELEASE_TIMING=$WORK/timing/${env}__none__${s}_rounds-$((rounds + 1))-$last.jsonl \
          taskset -c $CPUS bash $script $std $((rounds + 1)) $last > $more
      fi
    fi
    export RELEASE_TIMING=$WORK/timing/${env}__influence__$s.jsonl
    export FIRST_ROUND=$(iif_first_unfinished results_$env $s)
    if [ "$FIRST_ROUND" -le "$LAST_ROUND" ]; then
      log "$env seed $s: IIF rounds $FIRST_ROUND-$LAST_ROUND"
      bash $iif $s 12.5 $CPUS
      [ "$(iif_first_unfinished results_$env $s)" -gt "$LAST_ROUND" ] || {
        log "$env seed $s: IIF stopped before its last round"; exit 1; }
    fi
    if [ -z "${KEEP_BULK:-}" ]; then  # the seed's batch files, buffers and scores: no longer read
      for d in models_$env/*seed-$s models_$env/*seed-${s}_* outputs_*seed-${s}_*; do
        [ ! -d "$d" ] || find "$d" \( -name '*.pkl' -o -name '*.npy' \) -delete
      done
    fi
    log "$env seed $s: done"
  done
done
