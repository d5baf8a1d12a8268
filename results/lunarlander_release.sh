#!/usr/bin/env bash
# The released LunarLander scripts' differences from the paper's text, one at a time, under the test
# protocol of results/fig6b.sh (every round, 200 test episodes); docs/results.md, "LunarLander: the
# released code's differences". Each folder results/lunarlander-release/<variant>/ holds a standard
# PPO run ('none') and an IIF run ('influence') per seed, for analysis.py efficiency --runs:
# - reseed: IIF with --reseed-rounds (every round starts from the same env seed and torch seed, as
#   the release's one process per round does), beside the standard PPO of results/runs;
# - adam: standard PPO and IIF with Adam at 1e-3 (the release's headline LunarLander scripts; the
#   paper's text and the *_sgd scripts: SGD at 5e-3);
# - adam-reseed: both, the release's headline IIF runs, beside adam's standard PPO;
# - preset: links to the same seeds of results/runs (SGD 5e-3, episodes run on), for comparison.
# The released code's 100-round window needs no runs: analysis_variants.py efficiency --rounds 100.
# Resumable (see reproduce.sh); runs one at a time (two VARIANTS lists side by side use two cores).
#   [VARIANTS="reseed adam adam-reseed"] [SEEDS="1 2 3 4 5"] bash results/lunarlander_release.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/lunarlander-release
env=LunarLander-v3
test="--eval-every 1 --eval-episodes 200 --env-backend envpool"  # the backend its runs were made on
adam="--optimizer adam --learning-rate 1e-3"
run() {  # variant method seed [flags]
  mkdir -p "$out/$1"
  RUNS="$out/$1" bash results/reproduce.sh $env "$2" "$3" $test "${@:4}" > "$out/$1.$2.$3.log" 2>&1 &&
    rm "$out/$1.$2.$3.log"
}
for s in ${SEEDS:-1 2 3 4 5}; do  # the preset's runs of the same seeds, for the table beside these
  mkdir -p "$out/preset"
  for m in none influence; do ln -sfn "../../runs/${env}__${m}__$s" "$out/preset/${env}__${m}__$s"; done
done
for v in ${VARIANTS:-reseed adam adam-reseed}; do for s in ${SEEDS:-1 2 3 4 5}; do
  case $v in
    reseed) run reseed influence "$s" --reseed-rounds
      ln -sfn "../../runs/${env}__none__$s" "$out/reseed/${env}__none__$s" ;;
    adam) run adam none "$s" $adam
      run adam influence "$s" $adam ;;
    adam-reseed) run adam-reseed influence "$s" $adam --reseed-rounds
      ln -sfn "../adam/${env}__none__$s" "$out/adam-reseed/${env}__none__$s" ;;
  esac
done; done
