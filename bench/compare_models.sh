#!/usr/bin/env bash
# Offline comparison of every model on one held-out seed range (the issue's closing table).
# Data: expert laps on track seeds 0-19, default colours + shift-3; split 0-15 / 16-17 / 18-19.
# Budget per model: configs/compare.json (8 epochs x 60 batches x 32 sequences). Resumable.
set -euo pipefail
cd "$(dirname "$0")/.."
NSAC=.venv/bin/nsacdrive
$NSAC collect --agent expert --seeds 0-19 --colour-preset default,shift-3 --out data/compare --workers 2 --resume
runs=()
for model in nsac nac gmle mcdropout ensemble evidential sdenet levy; do
  $NSAC train --model "$model" --data data/compare --out "runs/compare/$model" --config configs/compare.json --resume
  runs+=("runs/compare/$model")
done
$NSAC evaluate-offline "${runs[@]}" --data data/compare --colour-preset shift-3 --out runs/compare-offline
