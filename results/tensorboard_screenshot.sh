#!/usr/bin/env bash
# docs/tensorboard.png: TensorBoard's Time Series page for two CartPole-v1 runs of iif.py (IIF and standard PPO,
# 20 rounds), taken by headless Chromium (Debian's chromium package; WebGL off, so the charts draw as SVG).
#   bash results/tensorboard_screenshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'kill $tb 2>/dev/null; rm -rf "$work"' EXIT
for method in influence none; do
  python iif.py --env-id CartPole-v1 --total-timesteps 40960 --eval-episodes 20 --filter-method $method \
    --runs-dir "$work/runs" --run-name CartPole-v1__${method}__1 > /dev/null
done
tensorboard --logdir "$work/runs" --port 6006 > "$work/tb.log" 2>&1 & tb=$!
sleep 8
chromium --headless --no-sandbox --disable-gpu --disable-3d-apis --disable-webgl --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$work/chromium" \
  --window-size=1500,1150 --virtual-time-budget=25000 --screenshot=docs/tensorboard.png \
  "http://localhost:6006/?darkMode=false#timeseries"
