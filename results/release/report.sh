#!/usr/bin/env bash
# The authors' released code beside ours, per environment with converted runs in results/release:
# SE of the release's IIF over the release's standard PPO; ours (results/runs) over the same window
# of rounds; and the standard-PPO test curves of both, with the release's IIF
# (results/figures/release_<env>.png); where the release's standard run had every checkpoint tested
# (convert.py's none-all runs), those against its IIF (release_<env>_all.png).
# The release's LunarLander is LunarLander-v2 (gymnasium 0.29); ours is LunarLander-v3.
#
#   bash results/release/report.sh > results/figures/release.md
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pair in MiniGrid-Empty-8x8-v0:MiniGrid-Empty-8x8-v0 LunarLander-v2:LunarLander-v3; do
  env=${pair%%:*} our=${pair#*:}
  seeds=$(ls -d results/release/${env}__influence__* 2>/dev/null | sed 's/.*__//' | sort -n) || true
  [ -n "$seeds" ] || continue
  first=results/release/${env}__influence__$(echo $seeds | cut -d' ' -f1)/config.json
  rounds=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['num_rounds'])" $first)
  echo "## $env: the released code, seeds $(echo $seeds), $rounds IIF rounds"
  echo
  python research/analysis_variants.py efficiency --runs results/release --env $env --rounds $rounds
  echo
  ours=""
  for s in $seeds; do
    for m in none influence; do ln -s "$PWD/results/release/${env}__${m}__$s" "$tmp/${our}__release-${m}__$s"; done
    [ -d results/runs/${our}__influence__$s ] || continue
    ours="$ours $s"
    for m in none influence; do ln -s "$PWD/results/runs/${our}__${m}__$s" "$tmp/${our}__${m}__$s"; done
  done
  echo "## $our: ours (results/runs), seeds$ours, the first $rounds rounds"
  echo
  python research/analysis_variants.py efficiency --runs "$tmp" --env $our --rounds $rounds
  echo
  echo "## $our: the release's$([ $env = $our ] || echo " ($env)") standard PPO and IIF against ours"
  echo
  python research/analysis_variants.py curves --runs "$tmp" --env $our --labels none influence release-none release-influence --rounds $rounds \
    --out results/figures/release_${env%%-*}.png | sed 's/^/    /'
  echo
  if ls -d results/release/${env}__none-all__* > /dev/null 2>&1; then
    echo "## $env: the release's standard PPO with every checkpoint tested, and its IIF"
    echo
    python research/analysis_variants.py curves --runs results/release --env $env --labels none-all influence \
      --out results/figures/release_${env%%-*}_all.png | sed 's/^/    /'
    echo
  fi
  rm -f "$tmp"/*
done
