#!/usr/bin/env bash
# Closed-loop quality (issue 6's closing table): NSAC, GMLE and MC-Dropout trained by behaviour
# cloning on the same data, NSAC then improved by DAgger, all driving seed 42 and 1000-1009
# under default colours and three perturbation presets (never trained on: training uses
# default colours + colour augmentation). All three read the frames and the measured speed
# (configs/quality.json: speed_input; half the augmented sequences get a wide road/field
# recolouring, augment.recolour 0.5). Every step resumes; about 1 h of CPU on 2 cores.
# Data: expert laps on tracks 0-59, clean and with executed-action noise 0.2 (labels clean).
set -euo pipefail
cd "$(dirname "$0")/.."
NSAC=.venv/bin/nsacdrive
PRESETS=default,shift-3,random,color-v0
$NSAC collect --agent expert --seeds 0-59 --out data/quality --workers 2 --resume
$NSAC collect --agent expert --seeds 0-59 --noise 0.2 --out data/quality --workers 2 --resume
for model in nsac gmle mcdropout; do
  $NSAC train --model "$model" --data data/quality --out "runs/qs-$model" --config configs/quality.json --resume
done
$NSAC dagger --init runs/qs-nsac --rounds 1 --episodes-per-round 16 --lr 0.00025 --out runs/qs-dagger
$NSAC eval runs/qs-nsac runs/qs-dagger/runs/round-1 runs/qs-gmle runs/qs-mcdropout --seeds 42,1000-1009 \
  --colour-preset "$PRESETS" --workers 2 --out runs/qs-closed-loop --resume
$NSAC eval runs/qs-dagger/runs/round-1 --seeds 42,1000-1009 --colour-preset "$PRESETS" --throttle-cap 0.1 \
  --workers 2 --out runs/qs-closed-loop-capped --resume
$NSAC plot runs/qs-closed-loop --videos 2
