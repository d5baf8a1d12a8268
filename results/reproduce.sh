#!/usr/bin/env bash
# Runs iif_variants.py for every (env, method, seed) given, into $RUNS/<env>__<method>__<seed>/ (RUNS defaults
# to results/runs). Resumable: a run whose metrics.csv holds every round is skipped, an unfinished one
# continues from its last checkpoint (--resume).
#   bash results/reproduce.sh "FrozenLake-v1" "influence none random" "1 2 3" [extra iif_variants.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
envs=$1; methods=$2; seeds=$3; shift 3
runs=${RUNS:-results/runs}
for env in $envs; do for seed in $seeds; do for method in $methods; do
  name="${env}__${method}__${seed}"; dir="$runs/$name"
  rounds=$(python -c "import iif_variants as v, tyro, sys; print(v.resolve_args(tyro.cli(v.Args, args=['--env-id', '$env', *sys.argv[1:]])).num_rounds)" "$@")
  if [ -f "$dir/metrics.csv" ] && [ "$(($(wc -l < "$dir/metrics.csv") - 1))" -ge "$rounds" ]; then
    echo "skipped $name: finished in $dir (remove it, or set RUNS, to run it again)"; continue
  fi
  python research/iif_variants.py --env-id "$env" --filter-method "$method" --seed "$seed" --runs-dir "$runs" --run-name "$name" \
    --resume "$@"
done; done; done
