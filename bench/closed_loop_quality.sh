#!/usr/bin/env bash
# Closed-loop quality: NSAC, Lévy attention, GMLE and MC-Dropout trained by
# behaviour cloning on the same data, NSAC then improved by one DAgger round, all driving seed 42
# and 1000-1009 under default colours and three perturbation presets (never trained on: training
# uses default colours + colour augmentation), then once more with pedal caution 0.5. All read the
# frames and the measured speed (speed_input; half the augmented sequences get a wide road/field
# recolouring, augment.recolour 0.5). NSAC, GMLE and MC-Dropout use configs/quality.json, Lévy its
# own configs/quality-levy.json (kernel β 4, lr 5e-4, all 30 epochs).
# Data: expert laps on tracks 0-59, clean and with executed-action noise 0.2 (labels clean).
#
# One training seed per call: SEED=1 bash bench/closed_loop_quality.sh (default 0; runs are named
# runs/qs-MODEL-sSEED; the DAgger round keeps its own seed 0, as in the results tables).
# Every step resumes; about 1.5 h of CPU on 2 cores per seed.
set -euo pipefail
cd "$(dirname "$0")/.."
NSAC=.venv/bin/nsacdrive
SEED=${SEED:-0}
PRESETS=default,shift-3,random,color-v0
$NSAC collect --agent expert --seeds 0-59 --out data/quality --workers 2 --resume
$NSAC collect --agent expert --seeds 0-59 --noise 0.2 --out data/quality --workers 2 --resume
for model in nsac gmle mcdropout levy; do
  config=configs/quality.json
  [ "$model" = levy ] && config=configs/quality-levy.json
  $NSAC train --model "$model" --data data/quality --out "runs/qs-$model-s$SEED" --config "$config" --seed "$SEED" --resume
done
$NSAC dagger --init "runs/qs-nsac-s$SEED" --rounds 1 --episodes-per-round 16 --lr 0.00025 \
  --out "runs/qs-dagger-s$SEED"
RUNS=("runs/qs-nsac-s$SEED" "runs/qs-dagger-s$SEED/runs/round-1" "runs/qs-levy-s$SEED" "runs/qs-gmle-s$SEED" "runs/qs-mcdropout-s$SEED")
$NSAC eval "${RUNS[@]}" --seeds 42,1000-1009 --colour-preset "$PRESETS" --workers 2 \
  --out "runs/qs-closed-loop-s$SEED" --resume
$NSAC eval "${RUNS[@]}" --seeds 42,1000-1009 --colour-preset "$PRESETS" --pedal-caution 0.5 --workers 2 \
  --out "runs/qs-closed-loop-cautious-s$SEED" --resume
$NSAC plot "runs/qs-closed-loop-s$SEED" --videos 2
