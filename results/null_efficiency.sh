#!/usr/bin/env bash
# The noise floor of Fig. 6(b): standard PPO against standard PPO of another seed. Seed s's standard
# run is compared with seed s+1's (seed N's with seed 1's), relabelled "other-seed" as if it were a
# method: no record is filtered, so its SE is what seed-to-seed noise alone gives.
#   [R=results/runs] bash results/null_efficiency.sh ENV=N [ENV=N ...]   (seeds 1..N of ENV under R)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
envs=()
for e in "$@"; do
  IFS== read -r env n <<< "$e"; envs+=("$env")
  for s in $(seq "$n"); do
    ln -s "$PWD/${R:-results/runs}/${env}__none__$s" "$tmp/${env}__none__$s"
    ln -s "$PWD/${R:-results/runs}/${env}__none__$((s % n + 1))" "$tmp/${env}__other-seed__$s"
  done
done
python research/analysis_variants.py efficiency --runs "$tmp" --env "${envs[@]}" --label other-seed
